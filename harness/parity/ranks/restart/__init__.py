"""How a run stops and comes back (rank side): a resume row's save, drop and load (``resume``), the
state it audits (``resume_state``), the checkpoint methods (``resume_store``), and a resharded
row's hand-over between world sizes (``reshard``). Over ``sides/`` (the engines they rebuild),
beside ``measure/``."""

DIR_ENV = "SHARDSCALE_RESUME_DIR"
"""Where resume rows write their checkpoints (default: the system's temporary folder); it must be
one folder every rank sees. Here, not in ``resume``: the controller reads it without importing
the checkpoint libraries."""
