"""The notebook app: the apps (``widgets``; its stable path is ``batchsum.widgets``) and the run
chart (``chart``). Needs the ``notebook`` extra.
"""
