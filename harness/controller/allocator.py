"""How the ranks' C allocator hands freed memory back (controller side: it starts the ranks).

Why: glibc's ``malloc`` serves a block from its heap once the block is under the *mmap
threshold*, and raises that threshold (up to 32 MiB) each time a mapped block is freed. A
training loop allocates and frees tensors of a few MiB by the hundred (weights' gradients, the
all-gather buffers, a reference's records), so after the first step they all come from the heap,
which returns a freed block to the system only from its top: a rank's resident set keeps every
hole the order of frees left. Measured on a 55M-parameter Llama row (2 ranks): each rank's peak
was 2.5 GB of resident memory for 1.3 GB of live tensors; with blocks of 1 MiB and more mapped
and unmapped by themselves, 1.55 GB. A warm rank runs case after case, so the holes would also
outlive the case that made them.

Mapping costs a page fault per page touched; transparent huge pages (``hugetlb=1``: glibc asks
for them with ``madvise`` on its mapped blocks; glibc 2.35 and later) make that one fault per
2 MiB, and the time is what it was (27.4 s against 27.5 s for that row). Both settings are glibc
tunables, read when a process starts, so they go into the environment the forkserver is started
with (every rank is forked from it; ``reaper.start_tagged_forkserver``). A tunable the user set
in ``GLIBC_TUNABLES`` is kept as they set it; other C libraries ignore the variable.
"""

from __future__ import annotations

VARIABLE = "GLIBC_TUNABLES"
RANK_TUNABLES = {"glibc.malloc.mmap_threshold": "1048576", "glibc.malloc.hugetlb": "1"}
"""Blocks of 1 MiB and more are mapped (and unmapped when freed); mapped blocks get huge pages."""


def tunables(inherited: str | None) -> str:
    """``inherited`` (the user's ``GLIBC_TUNABLES``, colon-separated ``name=value``) with
    :data:`RANK_TUNABLES` added where the user did not set the same name."""
    parts = [part for part in (inherited or "").split(":") if part]
    names = {part.split("=", 1)[0] for part in parts}
    parts += [f"{name}={value}" for name, value in RANK_TUNABLES.items() if name not in names]
    return ":".join(parts)
