"""What the gate checks before it runs anything: the GPUs it was promised and ranks that start.

Why: the gate's exit status must tell "the code regressed" (1) from "this machine cannot run the
tier" (2). A rank pool that cannot start, or a GPU runner that lost its GPUs, would otherwise show
up as hundreds of failed tests, read as a regression.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

RANK_TARGET = "ci.gate.preflight:all_reduce_rank"


def gpus() -> int:
    """CUDA GPUs this process can see."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def all_reduce_rank() -> float:
    """Runs on every rank: one all_reduce of the rank number (on the rank's GPU for NCCL)."""
    import harness

    context = harness.current()
    value = torch.tensor([float(context.rank)], device=context.device)
    dist.all_reduce(value)
    return float(value.item())


def check_ranks(backend: str, world_size: int, *, deadline_s: float = 120.0) -> str | None:
    """Start ``world_size`` ranks on ``backend`` and run one collective; the reason when that
    fails, ``None`` when it works."""
    from harness import DistConfig
    from harness.controller.pool import CaseSpec, PoolError, RankPool
    from harness.outcome import judge

    pool = RankPool(threads_per_rank=1)
    try:
        results = pool.run(
            CaseSpec(
                target=RANK_TARGET,
                config=DistConfig(world_size=world_size, backend=backend),
                deadline_s=deadline_s,
                collective_timeout_s=deadline_s / 2,
            )
        )
    except PoolError as error:
        return f"the ranks could not be started: {error}"
    finally:
        pool.close()
    verdict = judge(results, world_size=world_size)
    expected = float(sum(range(world_size)))
    if verdict.outcome != "passed":
        return (
            f"{world_size} {backend} ranks could not run one all_reduce: {verdict.message or verdict.summary}"
        )
    if any(value != expected for value in verdict.values):
        return f"{world_size} {backend} ranks summed their ranks to {verdict.values}, expected {expected}"
    return None
