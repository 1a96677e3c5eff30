"""The service layer: what batchsum knows of the summarization API and how it talks to it.

``contract`` (the interface, stated once), ``settings`` (the client's settings, every check of an
option's value, the environment), ``client`` (``Client`` / ``AsyncClient``) with ``answer`` (an
answer read within its cap) and ``inflate`` (bounded content decoding), ``retry`` (the retry policy),
``rate_headers`` (what rate-limit headers state), ``errors`` (the exception tree; its stable path is
``batchsum.errors``) with ``error_body`` (what an error answer says) and ``redact`` (redaction), and
``version``.
"""
