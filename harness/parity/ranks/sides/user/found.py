"""What a user's ``parallelize`` function did to the model, as read from torch's own state.

Why a value: the candidate runs the function and its twin must not (the twin is the unsharded
model, built from the workload as the function received it), so what the function did is read
once, off the modules it returned (``discover.py``), and handed to the twin as plain data: which
modules ``fully_shard`` made units and with which policy, reshard, offload, divide factor and
mesh; which ones it checkpointed, with or without the RNG replayed; which ones it compiled, with
which backend; which linears it split for tensor parallelism; whether DDP wraps the root; and what
it did that the twin cannot mirror (:attr:`Found.refused`). Names are the unwrapped model's
(``layers.0``, never ``layers.0._checkpoint_wrapped_module``); the root is ``""``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.parity.plan.precision import PrecisionPolicy

READ_FROM_TORCH = ". Read from torch: "
"""Between a candidate description's summary and its per-module lines (the report splits there:
``report/markdown.your_parallelization``)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Unit:
    """One ``fully_shard`` call's parameter group."""

    module: str
    """The module ``fully_shard`` was called on (``""``: the root)."""
    params: tuple[str, ...]
    """Its own parameters (those of nested units excluded), in the group's order: the order of
    its reduce-scatter buffer."""
    policy: PrecisionPolicy | None
    """Its ``MixedPrecisionPolicy`` as the twin emulates it (``None``: float32 throughout)."""
    reshard: str
    """``after forward``, ``kept`` or ``to N ranks`` (changes no value: reported)."""
    offload: bool
    """``CPUOffloadPolicy`` (changes no value: reported)."""
    divide_factor: float | None
    """``set_gradient_divide_factor`` (``None``: torch's, the data-parallel size)."""
    mesh: tuple[tuple[str, int], ...]
    """The mesh it shards over, ``((name, size), ...)`` (two dimensions: HSDP)."""
    syncs: bool = True
    """Whether it reduces gradients at all (``set_requires_gradient_sync``)."""

    def words(self) -> str:
        mesh = " x ".join(f"{n or 'dim'} {s}" for n, s in self.mesh)
        parts = [f"fully_shard over {mesh}", f"{len(self.params)} parameters"]
        policy = self.policy
        parts.append(
            f"MixedPrecisionPolicy param {policy.param}, reduce {policy.reduce_dtype}, output "
            f"{policy.output or 'as computed'}, inputs cast {'at the unit' if policy.inputs == 'units' else 'nowhere'}"
            if policy is not None
            else "float32"
        )
        parts.append(f"reshard {self.reshard}")
        if self.offload:
            parts.append("CPUOffloadPolicy")
        if self.divide_factor is not None:
            parts.append(f"gradient divide factor {self.divide_factor:g}")
        if not self.syncs:
            parts.append("gradient sync OFF")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Compiled:
    """One module the function compiled, and how (the twin compiles its own with the same)."""

    module: str
    backend: Any
    """The backend object dynamo was handed (``"inductor"`` resolves to inductor's wrapper with its
    mode and options inside): the twin compiles with the very same object."""
    backend_name: str
    fullgraph: bool
    dynamic: bool | None
    how: str
    """``module.compile()`` (in place), ``torch.compile(module)`` (a wrapper module), or
    ``torch.compile(DDP(model))`` (compiled around DDP: dynamo splits the graph at its buckets)."""

    @property
    def around_ddp(self) -> bool:
        return self.how == "torch.compile(DDP(model))"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Found:
    """Everything the engine read off the function's result."""

    units: tuple[Unit, ...] = ()
    checkpointed: tuple[tuple[str, bool], ...] = ()
    """``(module, RNG state replayed in the recompute)`` per activation-checkpointed module."""
    compiled: tuple[Compiled, ...] = ()
    tp: tuple[tuple[str, Any], ...] = ()
    """``(module, its ParallelStyle)`` as ``parallelize_module`` applied them, in order."""
    tp_degree: int | None = None
    tp_dim: str | None = None
    """The name of the mesh dimension the styles were applied over (its group is the TP group)."""
    ddp: dict[str, Any] | None = None
    """DDP around the root: its settings that matter to the twin (``bucket_cap_mb``)."""
    never_reduced: tuple[str, ...] = ()
    """Trainable parameters no ``fully_shard`` unit and no DDP manages: each rank keeps its own
    gradient (a root left without ``fully_shard``)."""
    split_ties: tuple[str, ...] = ()
    """Ties of the model as built whose names the function's units hold apart (``lm_head.weight =
    embed.weight``): FSDP keeps one copy per unit and the tie is gone after the first step."""
    refused: tuple[str, ...] = ()
    """What the twin cannot mirror, each naming the feature and the way out: the row is an error."""

    @property
    def sharded(self) -> bool:
        return bool(self.units)

    def policies(self) -> list[PrecisionPolicy | None]:
        return [unit.policy for unit in self.units if unit.params]

    def lines(self) -> list[str]:
        """Per module, what the function did (what the report and ``--list`` print)."""
        out = [f"{unit.module or '(root)'}: {unit.words()}" for unit in self.units]
        if self.ddp is not None:
            out.append(f"(root): DDP, bucket_cap_mb {self.ddp['bucket_cap_mb']:g}")
        out += [
            f"{name or '(root)'}: activation checkpointing"
            + ("" if replay else " WITHOUT preserve_rng_state")
            for name, replay in self.checkpointed
        ]
        out += [f"{c.module or '(root)'}: {c.how} ({c.backend_name})" for c in self.compiled]
        out += [f"{name}: {type(style).__name__} over tp {self.tp_degree}" for name, style in self.tp]
        out += [
            f"tie {tie} split over two fully_shard units: each keeps its own copy" for tie in self.split_ties
        ]
        if self.never_reduced:
            shown = ", ".join(self.never_reduced[:4]) + (" ..." if len(self.never_reduced) > 4 else "")
            out.append(
                f"{len(self.never_reduced)} trainable parameters under no fully_shard and no DDP, never "
                f"reduced: {shown}"
            )
        return out

    def summary(self) -> str:
        """One line: what the candidate is."""
        kinds = []
        if self.units:
            kinds.append(f"fully_shard on {len(self.units)} modules")
        if self.ddp is not None:
            kinds.append("DDP")
        if self.tp:
            kinds.append(f"TP on {len(self.tp)} modules")
        if self.checkpointed:
            kinds.append(f"activation checkpointing on {len(self.checkpointed)}")
        if self.compiled:
            kinds.append(f"torch.compile on {len(self.compiled)}")
        return ", ".join(kinds) or "nothing torch records (the model as it came)"
