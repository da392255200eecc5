"""Stage 5, the reports: ``parity.json`` and ``parity.md`` (``render``) and the PNG (``plot``).
Pure renderers of judged results; import ``judge`` and below, never a door.
"""
