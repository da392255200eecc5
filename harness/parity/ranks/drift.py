"""The drift a legitimate reordering alone produces (rank side, on request): the reference trained
twice straight through, once reducing as its candidate does and once summing the ranks in
reverse order, and the distance between the two, step by step.

Why: a row the staged check decides (``staged.py``) was not bitwise straight through, and its
report still shows the straight-through distance as the drift its reordering leaves. Whether that
drift is large or ordinary is only readable beside what another order alone does to the same
training: this curve. It costs two more reference runs per row, so the runner asks for it only
with ``--drift`` (``runner.run(drift=True)``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks import train
from harness.parity.ranks.measure import ulp
from harness.parity.ranks.wire import RankStep, StepTensors


def _max_ulp(a: StepTensors, b: StepTensors) -> float:
    """The largest ulp distance of any parameter, gradient or optimizer state element."""
    found = 0.0
    for mine, theirs in ((a.params, b.params), (a.grads, b.grads)):
        found = max([found, *(ulp.max_distance(mine[n], theirs[n]) for n in mine if n in theirs)])
    for name, values in a.optim_state.items():
        for key, value in values.items():
            other = b.optim_state.get(name, {}).get(key)
            if other is not None and value.is_floating_point():
                found = max(found, ulp.max_distance(value, other))
    return found


def reordering_drift(config: ParityConfig, device: torch.device) -> tuple[float, ...]:
    """Per step, the largest ulp distance of any tensor between the reference reduced as its
    candidate reduces and the same reference summing the ranks in reverse order (rank 0; the other
    ranks return ``()``). Raises what a run raised (the caller records it)."""
    plain = train.Run(config, "reference", device)
    other = train.Run(config, "reference", device, summed_in_reverse=True)
    steps_plain, steps_other = iter(plain), iter(other)
    drift: list[float] = []
    for _ in range(config.steps):
        a: RankStep | None = next(steps_plain, None)
        b: RankStep | None = next(steps_other, None)
        if a is None or b is None:
            break
        if dist.get_rank() == 0:
            assert a.tensors is not None and b.tensors is not None, "a run without a check records them"
            drift.append(_max_ulp(a.tensors, b.tensors))
    for run in (plain, other):
        if run.error is not None:
            raise RuntimeError(f"the drift's reference run failed:\n{run.error}")
    return tuple(drift)
