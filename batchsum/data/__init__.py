"""The data: rows and results (``results``), Arrow datasets in and out (``datasets``), answer stores
and claims (``stores``), the SQLite journal and the Redis store (``journal``), and the CSV formula
rule (``csvsafe``).
"""
