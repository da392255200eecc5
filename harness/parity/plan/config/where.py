"""Where a configuration can run (controller side): why a row is skipped here, said in the
report and the skip.

Why apart from the configuration: the reasons are facts about backends, machines and torch
(NCCL needs a GPU per rank, gloo lacks fp16 sparse sums, torch's DualPipeV needs as many
microbatches as stages), each measured, and the list grows apart from the configuration's own
rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.parity.plan.config.mesh import pipeline_unsupported
from harness.parity.workload import registry

if TYPE_CHECKING:
    from harness.parity.plan.config import ParityConfig


def unsupported_reason(config: ParityConfig, *, gpus: int = 0) -> str | None:
    """Why ``config`` cannot run here (``None`` when it can): said in the report and the skip."""
    widest = max(config.world_size, config.resume.world_size or 0)
    if config.backend == "nccl" and gpus < widest:
        return f"nccl world size {widest} needs {widest} CUDA GPUs, this machine has {gpus}"
    if config.layout.sharding == "hybrid_shard" and (config.world_size < 4 or config.world_size % 2):
        return (
            "HYBRID_SHARD shards within a node and replicates across nodes, so it needs a 2-D mesh: "
            f"an even world size >= 4, not {config.world_size} (run with --world-size 4)"
        )
    if (reason := config.mesh.unsupported(config.world_size)) is not None:
        return reason
    if (reason := pipeline_unsupported(config)) is not None:
        return reason
    if config.engine == "fsdp1" and config.layout.offload and config.backend == "gloo":
        return (
            "FSDP1 CPUOffload(offload_params=True) needs an accelerator (pinned memory); the GPU tier runs it"
        )
    if registry.get(config.workload).sparse and config.precision.dtype == "fp16" and config.backend == "gloo":
        return "gloo cannot all-reduce fp16 sparse gradients ('cadd_sparse' not implemented for 'Half'); the GPU tier runs it"
    if config.world_size < 2 and any(f.rank not in (None, 0) for f in config.faults):
        return f"a fault on rank {max(f.rank or 0 for f in config.faults)} needs world size >= 2"
    return None
