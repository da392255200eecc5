"""The ranks start with glibc tunables that map blocks of 1 MiB and more, so that memory a rank
frees goes back to the system instead of staying in holes of its heap (``controller/allocator.py``)."""

from __future__ import annotations

import os

import torch

from harness.controller import allocator
from harness.controller.memory import rss

_MIB = 2**20


def test_the_users_own_tunables_are_kept_and_ours_added_after_them():
    mine = "glibc.malloc.mmap_threshold=65536:glibc.malloc.arena_max=2"
    assert allocator.tunables(mine) == f"{mine}:glibc.malloc.hugetlb=1"


def test_without_tunables_of_the_users_the_ranks_get_ours():
    assert allocator.tunables(None) == "glibc.malloc.mmap_threshold=1048576:glibc.malloc.hugetlb=1"


def _tunables_and_freed_mib() -> tuple[str | None, float]:
    """The rank's ``GLIBC_TUNABLES``, and how many MiB of 64 freed 2 MiB tensors (every other of
    128, so no freed block sits at the top of a heap) left the resident set."""
    warm = torch.empty(_MIB // 2)  # a mapped block freed raises glibc's own threshold past 2 MiB
    del warm
    held = [torch.ones(_MIB // 2) for _ in range(128)]  # 2 MiB each
    before = rss(os.getpid())[1]
    del held[::2]
    after = rss(os.getpid())[1]
    return os.environ.get(allocator.VARIABLE), (before - after) / _MIB


def test_a_rank_gives_freed_tensors_back_to_the_system(ranks):
    for tunables, freed in ranks.run(_tunables_and_freed_mib, world_size=2):
        assert "glibc.malloc.mmap_threshold=1048576" in (tunables or ""), tunables
        assert freed > 0.9 * 128, f"{freed:.0f} of 128 MiB freed went back to the system"
