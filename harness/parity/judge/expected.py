"""Why a configuration must fail (rank-independent, controller side): the rows kept in the
matrices because each shows a known defect, which the report marks as expected.

Why its own module: the list grows with every defect the engine finds in torch (its scaler on
fused paths, a pipeline schedule's resharding), apart from how a verdict is judged (``result.py``).
"""

from __future__ import annotations

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.config.mesh import SPLIT_BACKWARD
from harness.parity.workload import registry


def expected_failure(config: ParityConfig) -> str:
    """Why ``config`` must fail (empty: it must pass): a candidate checkpointing without RNG replay
    (the rows that show the ``checkpoint_rng`` cause, on a workload with dropout), and torch's
    ShardedGradScaler where it is wrong.

    Its fused-optimizer path never agrees found_inf across ranks, so any overflow that some ranks
    see and others do not makes them diverge: a planted inf on one rank, or, in fp16 starting at
    scale 2**20, the first steps' natural overflows, which a sharded FSDP1 strategy leaves in some
    ranks' gradient shards only (NO_SHARD gives every rank the whole reduced gradient). FSDP2
    escapes: the unscale kernel on its DTensor gradients all-reduces found_inf inside DTensor
    dispatch, but ``unscale_`` followed by a fused step crashes there. And it coalesces only fp16
    sparse gradients before its check.
    """
    if config.loop.checkpoint == "no_replay":
        return (
            "checkpointing without RNG replay: under dropout the recompute draws other masks "
            "(the checkpoint_rng cause)"
        )
    if (
        config.mesh.pp is not None
        and config.mesh.schedule in SPLIT_BACKWARD
        and config.layout.reshard_after_forward
    ):
        return (
            f"torch 2.13's {config.mesh.schedule} with FSDP2 resharding after forward loses microbatches "
            "from weight gradients (the pp_zero_bubble_resharded cause)"
        )
    if config.scale.scaler != "torch":
        return ""
    if registry.get(config.workload).sparse and config.precision.dtype != "fp16":
        return (
            "torch's scaler coalesces only fp16 sparse gradients: fp32/bf16 duplicates that overflow "
            "only once summed go unnoticed"
        )
    if not config.fused:
        return ""
    if config.engine == "fsdp2":
        if config.loop.path == "unscale_clip":
            return "torch's scaler crashes: unscale_ then a fused step on DTensor grads (found_inf shape [1] vs [])"
        return ""
    if any(f.rank is not None for f in config.faults):
        return "torch's scaler never agrees found_inf on the fused path: ranks without the inf step anyway"
    if (
        config.precision.dtype == "fp16"
        and config.scale.init_scale >= 2.0**20
        and config.layout.sharding not in (None, "no_shard")
    ):
        return (
            "torch's scaler never agrees found_inf on the fused path: early fp16 overflows land in "
            "some ranks' gradient shards only"
        )
    return ""
