"""A loss that takes ``num_items``: the whole step's count of items, and how the engine scales it.

Why: a per-microbatch (or per-rank) mean over uneven counts of items (tokens whose label is not
ignored) trains unlike the whole batch, whatever the sharding (transformers' gradient
accumulation until it passed ``num_items_in_batch``). A workload whose loss takes ``num_items``
gets the step's total over every data-parallel rank's and every microbatch's batch, and writes its
loss as this batch's sum over its items divided by that total: each microbatch's loss is then its
share of the whole batch's. The engine divides every microbatch's loss by the microbatch count
(``ranks/sides/accumulate.py``) and the data-parallel reduction averages the ranks; a share must be
summed, not averaged, so the engine multiplies it by both (:func:`share_factor`), as transformers
multiplies by the process count and skips its division by the accumulation steps.

Every rank counts the items itself, from the batches it can draw (``registry.make_batch`` is
deterministic per ``(seed, rank, step)``): no collective, so nothing here can make ranks diverge.
"""

from __future__ import annotations

import functools

from harness.parity.workload import registry
from harness.parity.workload.spec import Workload


def share_factor(ranks: int, microbatches: int) -> float:
    """What a ``num_items`` loss is multiplied by: the microbatch count times the data-parallel
    size, which the accumulation's division and the ranks' average then undo."""
    return float(microbatches * ranks)


def global_count(workload: str, seed: int, ranks: int, microbatches: int, batch_index: int) -> int:
    """The items of the optimizer step that trains on batch ``batch_index`` (microbatch ``i`` of
    step ``s`` is batch ``s * microbatches + i``), over ``ranks`` data-parallel ranks and every
    microbatch; ``workload`` by its name or spec."""
    return _count(workload, seed, ranks, microbatches, batch_index // microbatches)


@functools.lru_cache(maxsize=64)
def _count(workload_name: str, seed: int, ranks: int, count: int, step: int) -> int:
    return step_count(registry.get(workload_name), seed, ranks, count, step)


def step_count(workload: Workload, seed: int, ranks: int, count: int, step: int) -> int:
    """The items of step ``step``'s batches: ``ranks`` data-parallel ranks, ``count`` microbatches."""
    assert workload.items is not None, "checked by Workload"
    total = 0
    for rank in range(ranks):
        for index in range(count):
            total += int(workload.items(registry.make_batch(workload, seed, rank, step * count + index)))
    return total
