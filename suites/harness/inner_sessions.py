"""Trivial distributed tests, run as inner pytest sessions by ``test_sessions.py`` (not collected).

The gloo tests (``-m "not gpu"``) all pass; each rank records which session, xdist worker, pid and
store port ran it, so the outer tests can see that concurrent sessions and xdist workers each used
their own store. ``test_sessions_overlap`` waits until every session named in
``SHARDSCALE_SELFTEST_PEERS`` has its ranks up, so the concurrent sessions really overlap.
``test_leaves_a_process_running`` starts a process that outlives the test, for the pool to clean
up at the end of the session. The NCCL tests (``-m gpu``) are skipped on a machine without GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import harness

_SESSION = os.environ.get("SHARDSCALE_SELFTEST_SESSION", "")
_left_running: list[subprocess.Popen] = []  # keeps the Popen alive: its __del__ would warn


def _out() -> Path:
    return Path(os.environ["SHARDSCALE_SELFTEST_DIR"])


def _record(test: str) -> None:
    ctx = harness.current()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    record = {
        "session": _SESSION,
        "worker": worker,
        "test": test,
        "rank": ctx.rank,
        "pid": os.getpid(),
        "port": ctx.store.underlying_store.port,
    }
    (_out() / f"record-{_SESSION}-{worker}-{test}-rank{ctx.rank}.json").write_text(json.dumps(record))


@harness.distributed(world_size=2)
@pytest.mark.parametrize("value", range(6))
def test_all_reduce(value, rank, world_size):
    _record(f"all_reduce{value}")
    t = torch.tensor([float(value + rank)])
    dist.all_reduce(t)
    assert t.item() == value * world_size + sum(range(world_size))


@harness.distributed(world_size=2)
def test_sessions_overlap(rank):
    """Every peer session has ranks up at the same time as this one, then each runs a collective."""
    _record("overlap")
    (_out() / f"up-{_SESSION}-rank{rank}").write_text("")
    peers = [p for p in os.environ.get("SHARDSCALE_SELFTEST_PEERS", "").split(",") if p]
    missing = peers
    until = time.monotonic() + 60
    while missing and time.monotonic() < until:
        missing = [p for p in peers if not all((_out() / f"up-{p}-rank{r}").exists() for r in (0, 1))]
        time.sleep(0.05)
    assert not missing, f"sessions {missing} never had their ranks up while session {_SESSION!r} did"
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == 2


@harness.distributed(world_size=2)
def test_leaves_a_process_running(rank):
    """Rank 0 starts a process (in its process group, like a DataLoader worker) and leaves it running."""
    _record("leaves_running")
    if rank == 0:
        _left_running.append(subprocess.Popen(["sleep", "600"]))
        (_out() / f"left-running-{_SESSION}-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.pid").write_text(
            str(_left_running[-1].pid)
        )


@harness.distributed(world_size=(1, 2), backend="nccl")
def test_nccl_all_reduce(world_size):
    t = torch.ones(1, device=harness.current().device)
    dist.all_reduce(t)
    assert t.item() == world_size


def _nccl_world_size():
    return dist.get_world_size()


@pytest.mark.gpu
def test_nccl_fixture_style(ranks):
    assert ranks.run(_nccl_world_size, world_size=2, backend="nccl") == [2, 2]
