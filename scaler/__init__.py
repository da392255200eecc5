"""shardscale's scaler library: AMP gradient scaling that is correct under sharding.

``GradScaler`` is a drop-in for ``torch.amp.GradScaler``; ``ShardedGradScaler`` agrees found_inf
across the process group once per optimizer step on every path; ``ShardedOptimizer`` wraps a
local optimizer over named (possibly sharded) parameters with name-keyed, reshardable state.
"""

from scaler._grad_scaler import GradScaler, OptState
from scaler._optimizer import ShardedOptimizer
from scaler._rule import (
    ScaleConfig,
    ScalerArgumentError,
    ScalerUsageError,
    ScaleState,
    next_scale_state,
    update_scale_,
)
from scaler._sharded import ShardedGradScaler, default_device

__all__ = [
    "GradScaler",
    "OptState",
    "ScaleConfig",
    "ScaleState",
    "ScalerArgumentError",
    "ScalerUsageError",
    "ShardedGradScaler",
    "ShardedOptimizer",
    "default_device",
    "next_scale_state",
    "update_scale_",
]
