"""The service layer: what batchsum knows of the summarization API and how it talks to it.

``contract`` (the interface, stated once), ``client`` (``Client`` / ``AsyncClient``), ``errors``
(the exception tree and redaction; its stable path is ``batchsum.errors``), ``retry`` (the retry
policy), ``inflate`` (bounded content decoding) and ``rate_headers`` (what rate-limit headers state).
"""
