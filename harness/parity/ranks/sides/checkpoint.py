"""Activation checkpointing of the FSDP units (rank side), on both sides of a configuration.

Each unit's forward runs under ``torch.utils.checkpoint.checkpoint`` (non-reentrant, the variant
FSDP1 and FSDP2 compose with): its activations are dropped after the forward and recomputed in
backward, once the unit's parameters are gathered again. Why the RNG matters: a unit with dropout
draws its masks from torch's RNG, and the recompute draws again. ``preserve_rng_state=True``
stashes the RNG state at the forward and replays it, so the recomputed masks are the forward's and
the gradients are those of an uncheckpointed run, bitwise. Without it the recompute draws from
wherever the RNG stands at backward, other masks, and the gradients belong to no forward at all.

The reference always replays (it is the truth the candidate must match); the candidate replays or
not as ``config.loop.checkpoint`` says (``replay``, ``no_replay``). The units are patched in place,
forward only, so every parameter keeps its name.
"""

from __future__ import annotations

from typing import Any

import torch.utils.checkpoint
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.sides import engines


def replays(config: ParityConfig, role: str) -> bool | None:
    """Whether ``role``'s run checkpoints with RNG replay (``None``: it does not checkpoint)."""
    if config.loop.checkpoint is None:
        return None
    return role == "reference" or config.loop.checkpoint == "replay"


def recorded(config: ParityConfig, role: str) -> str | None:
    """What a step records of it: ``replay``, ``no_replay`` or ``None``."""
    replayed = replays(config, role)
    return None if replayed is None else ("replay" if replayed else "no_replay")


def apply(units: list[nn.Module], *, replay: bool, workload: str) -> None:
    """Checkpoint every module of ``units`` (non-reentrant), replaying the RNG state or not."""
    if not units:
        raise ValueError(
            f"checkpoint needs FSDP units to checkpoint; workload {workload!r} has none (set Workload.units)"
        )
    for unit in units:
        inner = unit.forward

        def checkpointed(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            return torch.utils.checkpoint.checkpoint(
                _inner, *args, use_reentrant=False, preserve_rng_state=replay, **kwargs
            )

        unit.forward = checkpointed  # type: ignore[method-assign]


def install(engine: engines.Engine, config: ParityConfig, role: str) -> None:
    """Checkpoint the units of ``engine``'s trained module as ``config`` says for ``role`` (the
    training loop calls it once the engine is built and wrapped: FSDP1 keeps the unit modules
    inside its wrappers, FSDP2 shards them in place, so their forward can be patched either way)."""
    replay = replays(config, role)
    if replay is None:
        return
    model = engine.trained_module()
    apply(engines.unit_modules(model, engine.units), replay=replay, workload=config.workload)
    engine.description += ", units checkpointed" + ("" if replay else " without RNG replay")
