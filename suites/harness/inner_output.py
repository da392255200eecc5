"""Distributed tests that print, run as inner pytest sessions by ``test_output.py`` (not collected)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

import harness


@harness.distributed(world_size=2)
def test_prints_then_rank_1_fails(rank):
    print(f"hello from rank {rank}")
    print(f"warning from rank {rank}", file=sys.stderr)
    if rank == 1:
        raise AssertionError("rank 1 fails after printing")


@harness.distributed(world_size=2)
def test_prints_and_passes(rank):
    print(f"passing output of rank {rank}")


def _print_rank():
    rank = harness.current().rank
    print(f"fixture-style output of rank {rank}")
    return rank


def test_fixture_style_prints(ranks):
    assert ranks.run(_print_rank, world_size=2) == [0, 1]


@harness.distributed(world_size=2)
def test_waits_until_its_output_is_seen(rank):
    """Rank 0 prints, then waits (at most 30 s) for the outer test to create ``go`` after it read
    that line on this session's terminal: passes only if the line was shown while the test ran."""
    if rank == 0:
        print("waiting for the go file", flush=True)
        go = Path(os.environ["SHARDSCALE_SELFTEST_DIR"], "go")
        until = time.monotonic() + 30
        while not go.exists() and time.monotonic() < until:
            time.sleep(0.05)
        assert go.exists(), "nobody saw rank 0's line while the test ran"
    dist.barrier()
