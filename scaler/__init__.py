"""shardscale's scaler library: AMP gradient scaling that is correct under sharding.

``GradScaler`` is a drop-in for ``torch.amp.GradScaler``; ``ShardedGradScaler`` agrees found_inf
across the process group once per optimizer step on every path; ``ShardedOptimizer`` wraps a
local optimizer over named (possibly sharded) parameters with name-keyed, reshardable state.
"""

import torch

_TORCH_FLOOR = "2.6"
"""The oldest torch this library runs on (``torch.accelerator``, DTensor under
``torch.distributed.tensor``); pyproject.toml requires the same."""


def _check_torch_version(version: str) -> None:
    """Refuse, naming the fix, a torch older than the floor (an environment that pip's check did
    not guard, e.g. a source checkout on ``PYTHONPATH``)."""
    if torch.torch_version.TorchVersion(version) < _TORCH_FLOOR:
        raise ImportError(
            f"shardscale needs torch>={_TORCH_FLOOR}, found torch {version}; "
            f"install a newer one, e.g. pip install 'torch>={_TORCH_FLOOR}'"
        )


_check_torch_version(torch.__version__)

from scaler._grad_scaler import GradScaler, OptState  # noqa: E402
from scaler._optimizer import ShardedOptimizer  # noqa: E402
from scaler._rule import (  # noqa: E402
    ScaleConfig,
    ScalerArgumentError,
    ScalerUsageError,
    ScaleState,
    next_scale_state,
    update_scale_,
)
from scaler._sharded import ShardedGradScaler, default_device  # noqa: E402

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
