"""The notebook app: the apps (``widgets``, their door; its stable path is ``batchsum.widgets``),
built from ``controls``, ``summary``, ``text_app``, ``frame_app``, ``run_view`` and ``table``, and the
run chart (``chart``). Needs the ``notebook`` extra.
"""
