"""The data: rows and results (``results``), Arrow datasets in and out (``datasets``; the inputs in
``dataset_input``, where they are in ``locations``), answer stores and claims (``stores``), the SQLite
journal (``journal``; its file in ``journal_file``, its side file in ``side_file``), the lock a run
takes on its files (``run_lock``, ``lock_file``), the Redis store (``redis_store``), and the CSV
formula rule (``csvsafe``).
"""
