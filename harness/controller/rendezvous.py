"""The controller's rendezvous store.

Why the controller owns it (and why this is the one controller-side use of torch.distributed): a
``TCPStore`` opened on port 0 gets a free port from the OS, so two pytest sessions or xdist workers
on one host never race for a port, and the store outlives any rank, so peers of a dead rank get a
clean error instead of losing their rendezvous. Only the store server is created here; the
controller never joins a process group.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

HOST = "127.0.0.1"


def open_store() -> tuple[Any, str, int]:
    """Start a store server on a free port; return ``(store, host, port)``."""
    from torch.distributed import TCPStore

    store = TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    return store, HOST, store.port
