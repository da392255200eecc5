"""Activation checkpointing internals the harness reads: torch's ``checkpoint_wrapper`` class and
the composable API's registry of what was applied to a module.

Read from torch 2.11, 2.12, 2.13 and 2.14
(``torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py``,
``torch/distributed/_composable/contract.py``): the same.
"""

from __future__ import annotations

import inspect
from typing import Any


def wrapper_class() -> type:
    """``CheckpointWrapper``: what ``checkpoint_wrapper(module)`` returns."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    return CheckpointWrapper


def composable_registry(module: Any) -> dict[str, Any]:
    """What composable APIs (``fully_shard``, ``replicate``, ``checkpoint``) were applied to
    ``module``, by name (empty: none)."""
    from torch.distributed._composable.contract import _get_registry

    return dict(_get_registry(module) or {})


def composable_checkpoint() -> Any:
    """The composable ``checkpoint(module)`` (``torch.distributed._composable.checkpoint``)."""
    from torch.distributed._composable import checkpoint

    return checkpoint


def replays_rng(module: Any) -> bool | None:
    """Whether ``module`` is activation-checkpointed and its recompute replays the RNG state
    (``preserve_rng_state``); ``None``: it is not checkpointed. A ``checkpoint_wrapper`` keeps the
    argument in its ``checkpoint_fn`` partial; composable ``checkpoint(module)`` in the closure of
    the forward pre-hook it registers (named ``checkpoint.<locals>...``)."""
    if isinstance(module, wrapper_class()):
        return bool(getattr(module.checkpoint_fn, "keywords", {}).get("preserve_rng_state", True))
    for hook in module._forward_pre_hooks.values():
        if getattr(hook, "__qualname__", "").startswith("checkpoint."):
            return bool(inspect.getclosurevars(hook).nonlocals.get("preserve_rng_state", True))
    return None
