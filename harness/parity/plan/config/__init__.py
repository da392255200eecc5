"""One parity configuration: a small core and one frozen part per concern.

Why parts: every feature of the engine (a 2-D mesh, a recipe, a loop feature, a resume) adds
fields with rules of their own; as flat fields of one type they made a blackboard that every stage
re-read. Each part (``layout``, ``mesh``, ``precision``, ``loop``, ``resume``, ``scale``, and the
``faults`` planted) owns its validation, its words in the id and its share of the reference key,
and a function that needs one of them takes that part. The core names what is checked against
what: the candidate's engine, the workload, the optimizer, the reference, where it runs
(``world_size``, ``backend``), for how long and from which seed.

A configuration names a candidate (FSDP1, FSDP2, DDP, or the user's own function) and a reference
that it must train exactly like: ``reference="ddp"``, DDP over the same model, optimizer and
per-rank data, scaled by ``torch.amp.GradScaler`` (the trusted oracle), planned faults hitting
*every* rank of it; or ``reference="single"``, one process on every rank's batch (sparse gradients).

``ParityConfig.flat()``: the fields under their flat names (``-k field=value``, ``parity.json``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

from harness.parity.plan.config.axes import (
    BACKENDS,
    CHECKPOINTS,
    ENGINES,
    FAULT_VALUES,
    FSDP1_SHARDING,
    MATRIX_OPTIMIZERS,
    OPTIMIZERS,
    PATHS,
    PRECISIONS,
    REFERENCES,
    SCALERS,
    SUITES,
    SYNCS,
    choice,
)
from harness.parity.plan.config.compile import Compile
from harness.parity.plan.config.fault import Fault
from harness.parity.plan.config.layout import Layout
from harness.parity.plan.config.loop import Loop
from harness.parity.plan.config.mesh import Mesh
from harness.parity.plan.config.precision import Precision
from harness.parity.plan.config.resume import Resume
from harness.parity.plan.config.scale import Scale
from harness.parity.plan.config.where import unsupported_reason
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.workload import registry

__all__ = [
    "BACKENDS",
    "CHECKPOINTS",
    "ENGINES",
    "FAULT_VALUES",
    "FSDP1_SHARDING",
    "MATRIX_OPTIMIZERS",
    "OPTIMIZERS",
    "PATHS",
    "PRECISIONS",
    "REFERENCES",
    "SCALERS",
    "SUITES",
    "SYNCS",
    "Compile",
    "Fault",
    "Layout",
    "Loop",
    "Mesh",
    "ParityConfig",
    "Precision",
    "Resume",
    "Scale",
    "by_world",
    "poisoned_steps",
    "unique",
    "unsupported_reason",
]

_PARTS = {
    "layout": Layout,
    "mesh": Mesh,
    "precision": Precision,
    "loop": Loop,
    "resume": Resume,
    "scale": Scale,
    "compile": Compile,
}
_FLAT = {
    "sharding": ("layout", "sharding"),
    "use_orig_params": ("layout", "use_orig_params"),
    "reshard_after_forward": ("layout", "reshard_after_forward"),
    "hsdp": ("mesh", "hsdp"),
    "tp": ("mesh", "tp"),
    "mesh_dims": ("mesh", "dims"),
    "pp": ("mesh", "pp"),
    "schedule": ("mesh", "schedule"),
    "microbatches": ("mesh", "microbatches"),
    "precision": ("precision", "dtype"),
    "mixed": ("precision", "mixed"),
    "recipe": ("precision", "recipe"),
    "offload": ("layout", "offload"),
    "path": ("loop", "path"),
    "clip": ("loop", "clip"),
    "accumulate": ("loop", "accumulate"),
    "sync": ("loop", "sync"),
    "checkpoint": ("loop", "checkpoint"),
    "scaler": ("scale", "scaler"),
    "resume_at": ("resume", "at"),
    "resume_method": ("resume", "method"),
    "resume_layout": ("resume", "layout"),
    "resume_world_size": ("resume", "world_size"),
    "init_scale": ("scale", "init_scale"),
    "growth_interval": ("scale", "growth_interval"),
    "compile": ("compile", "mode"),
    "compile_backend": ("compile", "backend"),
    "compile_twin": ("compile", "twin"),
}
"""Each part's field under its flat name (``parity.json``'s, ``-k field=value``'s, ``with_``'s)."""
_FLAT_ORDER = (
    "engine", "suite", "sharding", "use_orig_params", "reshard_after_forward", "hsdp", "tp", "precision",
    "mixed", "recipe", "optimizer", "offload", "workload", "path", "clip", "accumulate", "sync",
    "checkpoint", "faults", "scaler", "reference", "world_size", "backend", "steps", "resume_at",
    "resume_method", "resume_layout", "resume_world_size", "init_scale", "growth_interval", "seed",
    "compile", "compile_backend", "compile_twin", "mesh_dims", "pp", "schedule", "microbatches",
)  # fmt: skip
"""The order ``parity.json`` records the fields in (that of the flat type they were once)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ParityConfig:
    """One candidate-vs-reference training run."""

    engine: str
    """The candidate: ``fsdp1``, ``fsdp2``, ``ddp``, or ``user`` (the workload's ``parallelize``)."""
    suite: str = "fsdp_vs_ddp"
    """Which suite (and report section) the configuration belongs to."""
    workload: str = "mlp"
    """A registered workload name (``mlp``, ``llama``, an entry point's) or ``module:function``
    (``harness.parity.workload.registry``); a string, so a configuration pickles to the ranks, which
    resolve it themselves."""
    optimizer: str = "sgd"
    reference: str = "ddp"
    world_size: int = 2
    backend: str = "gloo"
    steps: int = 6
    seed: int = 0
    layout: Layout = Layout()
    """How the engine lays the model out (FSDP1's strategy, FSDP2's reshard, offload)."""
    mesh: Mesh = Mesh()
    """A 1-D mesh, HSDP or FSDP2 + TP."""
    precision: Precision = Precision()
    """The dtype, the recipe that applies it, the candidate's policy."""
    loop: Loop = Loop()
    """The path through the scaler, clipping, accumulation, checkpointing."""
    resume: Resume = Resume()
    """A resume row's step, method, layout and world size (none by default)."""
    scale: Scale = Scale()
    """The candidate's scaler and the schedule both sides scale by."""
    faults: tuple[Fault, ...] = ()
    """Non-finite values planted into gradients (the forced-inf suite)."""
    compile: Compile = Compile()
    """``torch.compile`` of the model on both sides (``plan/config/compile.py``; none by default)."""

    def __post_init__(self) -> None:
        for name, kind in _PARTS.items():
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(
                    f"{name} must be a {kind.__name__} (harness.parity.plan.config.{kind.__name__}), got "
                    f"{value!r}; e.g. {name}={kind.__name__}()"
                )
        choice("engine", self.engine, ENGINES)
        choice("suite", self.suite, SUITES)
        choice("optimizer", self.optimizer, OPTIMIZERS)
        choice("reference", self.reference, REFERENCES)
        choice("backend", self.backend, BACKENDS)
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        self.layout.check(self.engine)
        for part in (self.loop, self.resume, self.mesh, self.precision, self.compile):
            part.check(self)  # each part's rules against the rest, in this order
        workload = registry.get(self.workload)
        if self.engine == "user" and workload.parallelize is None:
            raise ValueError(
                f"engine='user' needs Workload(parallelize=my_parallelize); {workload.name!r} has none"
            )
        if self.optimizer == "own" and workload.optimizer is None:
            raise ValueError(
                f"optimizer='own' needs a workload with an optimizer; {workload.name!r} has none "
                "(use e.g. optimizer='sgd')"
            )
        for fault in self.faults:
            if fault.step >= self.steps:
                raise ValueError(f"fault {fault.id} lies past the last step ({self.steps - 1})")
            if fault.optimizer == 1 and self.loop.path != "two_optimizers":
                raise ValueError(
                    f"fault {fault.id} names optimizer 1 but path={self.loop.path!r} has one optimizer"
                )
        if self.reference == "single" and not workload.sparse:
            raise ValueError(
                "reference='single' is for the sparse workload ('embedding'); use reference='ddp'"
            )
        if workload.sparse and (self.engine != "ddp" or self.reference != "single"):
            raise ValueError(
                "the sparse 'embedding' workload runs as engine='ddp' against reference='single' "
                "(FSDP does not shard sparse gradients)"
            )

    # -- naming -----------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """Readable and unique: ``fsdp1-full_shard-flat-fp16-adam_fused-w2``,
        ``fsdp2-reshard-offload-bf16-sgd-w2``, ``ddp-fp32-sgd-unscale_clip-inf@r1s2-w2``. A recipe
        other than ``pure`` is named where the precision is: ``fsdp2-reshard-autocast-fp16-sgd-w2``,
        ``fsdp1-full_shard-flat-mixed-bf16-sgd-w2``, ``fsdp2-keep-bf16-reduce32-adam-w2``."""
        parts = [self.engine, *self.layout.id_parts(self.engine, self.mesh.id_parts(self.world_size))]
        parts += self.precision.id_parts(self.engine)
        parts.append(self.optimizer)
        if self.workload != "mlp":
            parts.append(registry.get(self.workload).name)
        parts += self.loop.id_parts()
        parts += [fault.id for fault in self.faults]
        parts += self.resume.id_parts()
        parts += self.scale.id_parts()
        parts += self.compile.id_parts()
        parts.append(f"w{self.world_size}" + self.resume.to_world_size())
        if self.backend != "gloo":
            parts.append(self.backend)
        return "-".join(parts)

    def flat(self) -> dict[str, Any]:
        """Every field under its flat name, in the order ``parity.json`` records them."""
        return {
            name: getattr(getattr(self, _FLAT[name][0]), _FLAT[name][1])
            if name in _FLAT
            else getattr(self, name)
            for name in _FLAT_ORDER
        }

    @property
    def keywords(self) -> frozenset[str]:
        """What ``-k`` matches against: the id's parts, the suite, and ``field=value`` pairs."""
        words = set(self.id.split("-")) | {self.suite, self.id}
        words |= {f"{name}={value}" for name, value in self.flat().items() if name not in ("faults", "mixed")}
        if any(fault.rank is None for fault in self.faults):
            words.add("every_rank")
        if any(fault.rank is not None for fault in self.faults):
            words.add("one_rank")
        if self.fused:
            words.add("fused")
        if self.resume.at is not None:
            words |= {"resume", f"resume={self.resume.method}"}
        if self.resume.layout is not None:
            words.add("into")
        if self.resume.world_size is not None:
            words |= {"resharded", f"{self.world_size}to{self.resume.world_size}"}
        words |= {self.precision.name, f"recipe={self.precision.name}"}
        words |= {"compiled"} if self.compile.compiled else set()
        return frozenset(words)

    @property
    def recipe_name(self) -> str:
        """The recipe as users name it (``Precision.name``)."""
        return self.precision.name

    @property
    def policy(self) -> PrecisionPolicy | None:
        """The candidate's mixed precision under its engine (``Precision.policy``)."""
        return self.precision.policy(self.engine)

    @property
    def fused(self) -> bool:
        if self.optimizer == "own":
            return registry.fused_optimizer(registry.spec_of(self.workload))
        return self.optimizer.endswith("_fused")

    def reference_key(self) -> tuple[object, ...]:
        """Configurations with equal keys share one reference run (the candidate's fields excluded)."""
        ddp = self.reference == "ddp"
        return (
            self.reference,
            self.workload,
            self.precision.dtype,
            self.policy if ddp else None,  # FSDP1 and FSDP2 references differ
            self.precision.autocast,
            # the candidate's engine: FSDP2's autograd nodes and each engine's divide factors (twin.py)
            self.engine if ddp else None,
            self.reduce_layout_key(),
            self.optimizer,
            self.loop.reference_key(),
            tuple((f.step, f.value, f.optimizer) for f in self.faults),
            self.scale.reference_key(self.reference),
            self.world_size,
            self.mesh.tp,  # whose batch each rank trains, and the TP'd modules the twin splits
            self.mesh.dims,
            self.mesh.pipeline_key(self.policy),
            self.backend,
            self.steps,
            self.resume.reference_key(),
            self.seed,
            self.compile.reference_key(),
        )

    def reduce_layout_key(self) -> tuple[object, ...]:
        """What of the candidate's gradient buffers the reference mirrors (``sides/reduce_layout.py``)
        from 3 ranks on: FSDP1's strategy and alignment, HSDP's stages (``Layout``, ``Mesh``); a
        resume row back in another layout adds where it changes and into what. Empty at 2 ranks,
        where every layout sums each element in the same order (the layouts' references stay one
        run); except with a fused optimizer, whose reference steps the candidate's shards
        (``sides/optim/step_pieces.py``), which the layout cuts at every world size."""
        if self.reference != "ddp" or (self.world_size <= 2 and not self.fused):
            return ()
        own = self.mesh.reduce_layout_key() or self.layout.reduce_layout_key(self.engine)
        if self.resume.layout is None:
            return own
        return (*own, self.engine, self.resume.at, self.resume.layout)  # another layout from resume.at

    def with_(self, **changes: object) -> ParityConfig:
        """A copy with some fields changed (validated again): core fields and parts by their own
        names, a part's field by its flat name (``with_(precision="fp32", mixed=None)`` is the
        float32 twin; ``with_(clip=0.05, path="unscale_clip")``)."""
        return dataclasses.replace(self, **_routed(changes, self))  # type: ignore[arg-type]

    @classmethod
    def from_flat(cls, **fields: object) -> ParityConfig:
        """The configuration whose :meth:`flat` fields are ``fields`` (as ``parity.json`` records
        them; faults as :class:`Fault` objects), parts given whole taken as they are: the inverse of
        :meth:`flat`, for reading a report back and for tables of rows written flat."""
        return cls(**_routed(fields, None))  # type: ignore[arg-type]


def _routed(changes: dict[str, object], base: ParityConfig | None) -> dict[str, object]:
    """``changes`` by core field and part: each flat name folded into its part (``base``'s, a part
    given whole in ``changes``, or a default one)."""
    core: dict[str, object] = {}
    parts: dict[str, dict[str, object]] = {}
    for name, value in changes.items():
        if name in ("precision", "compile") and not isinstance(value, _PARTS[name]):
            part, field = _FLAT[name]  # a part's name is also its main field's flat name
            parts.setdefault(part, {})[field] = value
        elif name in _FLAT and name not in _PARTS:
            part, field = _FLAT[name]
            parts.setdefault(part, {})[field] = value
        else:
            core[name] = value
    for part, fields in parts.items():
        whole = core.get(part, getattr(base, part) if base is not None else _PARTS[part]())
        core[part] = dataclasses.replace(whole, **fields)  # type: ignore[type-var]
    return core


def unique(configs: Iterable[ParityConfig]) -> list[ParityConfig]:
    """``configs`` without repeats (equal ids), first occurrence kept."""
    seen: dict[str, ParityConfig] = {}
    for config in configs:
        seen.setdefault(config.id, config)
    return list(seen.values())


def by_world(configs: Iterable[ParityConfig]) -> Iterator[tuple[tuple[str, int], list[ParityConfig]]]:
    """Configurations grouped by ``(backend, world_size)`` (one process group each), in first-seen order."""
    groups: dict[tuple[str, int], list[ParityConfig]] = {}
    for config in configs:
        groups.setdefault((config.backend, config.world_size), []).append(config)
    yield from groups.items()


def poisoned_steps(config: ParityConfig) -> frozenset[int]:
    """Steps whose gradients hold a planted non-finite value: the faults', and the sparse workload's
    overflow step (one process unscales each finite duplicate before summing, DDP sums them scaled,
    so the overflow shows in one run's gradient only; both must skip). Their gradients are not
    compared (the ranks compare where the data lives, so they need this as much as the judge)."""
    steps = {fault.step for fault in config.faults}
    if registry.get(config.workload).sparse:
        steps.add(registry.OVERFLOW_STEP)
    return frozenset(steps)
