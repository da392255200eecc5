"""One parity configuration: the frozen, validated :class:`ParityConfig` and the axes it draws from.

Why apart from the matrices (``matrix.py``, ``workload_matrix.py``): both build lists of these,
and everything downstream (the ranks, the judge, the reports) needs the type and not the lists.
A configuration names a candidate (FSDP1, FSDP2 or DDP) and a reference that it must train
exactly like:

* ``reference="ddp"``: DDP over the same model, optimizer and per-rank data, in the same
  precision, scaled by ``torch.amp.GradScaler`` (a replicated reference needs no agreement, so
  torch's single-device scaler is the trusted oracle). Planned faults hit *every* rank of the
  reference: it shows what every rank of the candidate must do when any rank overflows.
* ``reference="single"``: one process trains on every rank's batch at once, with the scaler
  under test (for sparse gradients, which FSDP does not support).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from harness.parity.plan import recipe as recipes
from harness.parity.plan import resume_spec, two_d
from harness.parity.plan.precision import PrecisionPolicy
from harness.parity.workload import registry

ENGINES = ("ddp", "fsdp1", "fsdp2")
FSDP1_SHARDING = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard")
PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("sgd", "adam", "adam_fused", "adamw", "sgd_plain", "own")
"""``sgd``: SGD with momentum 0.9 (not scale-invariant, so scaler bugs show); ``adam``:
``Adam(foreach=True)``; ``adam_fused``: ``Adam(fused=True)`` (unscales and skips inside its kernel);
``adamw``: ``AdamW(foreach=True, weight_decay=0.01)`` (the 2-D rows' optimizer, as torchtitan's);
``sgd_plain``: SGD without momentum (fp16 sparse gradients: a sparse momentum buffer needs a sparse
``add`` that the CPU lacks for fp16); ``own``: the workload's ``optimizer``."""
PATHS = ("plain", "unscale_clip", "two_optimizers")
"""``plain``: ``scale -> backward -> step -> update``; ``unscale_clip``: ``unscale_`` then
``clip_grad_norm_`` before ``step``; ``two_optimizers``: the parameters split over two optimizers,
both stepped through one scaler, one ``update``."""
MATRIX_OPTIMIZERS = ("sgd", "adam", "adam_fused")
"""The optimizer axis of the FSDP-vs-DDP matrix."""
SCALERS = ("ours", "torch")
REFERENCES = ("ddp", "single")
SUITES = ("fsdp_vs_ddp", "forced_inf", "sparse", "cpu_offload")
BACKENDS = ("gloo", "nccl")
SYNCS = ("every", "last")
CHECKPOINTS = (None, "replay", "no_replay")
"""Activation checkpointing of the units: none, with the RNG state replayed in the recompute
(``preserve_rng_state=True``), or without (a bug under dropout)."""
"""When gradient accumulation reduces: every microbatch, or only the last (``no_sync()``)."""
FAULT_VALUES = ("inf", "nan")


def _choice(name: str, value: object, allowed: Iterable[object]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    """A non-finite value written into one gradient after backward (before unscaling)."""

    step: int
    """The step it happens in (0-based)."""
    rank: int | None = 1
    """The one rank whose gradient is poisoned; ``None``: every rank at once."""
    value: str = "inf"
    """``"inf"`` or ``"nan"``."""
    optimizer: int = 0
    """Which optimizer's parameters get it (``two_optimizers``: 0 or 1)."""

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"Fault.step must be >= 0, got {self.step}")
        if self.rank is not None and self.rank < 0:
            raise ValueError(f"Fault.rank must be >= 0 or None (every rank), got {self.rank}")
        _choice("Fault.value", self.value, FAULT_VALUES)
        _choice("Fault.optimizer", self.optimizer, (0, 1))

    @property
    def id(self) -> str:
        """``inf@r1s2`` (rank 1, step 2), ``nan@alls4`` (every rank, step 4); ``o1`` marks optimizer 1."""
        where = "all" if self.rank is None else f"r{self.rank}"
        return f"{self.value}@{where}s{self.step}" + (f"o{self.optimizer}" if self.optimizer else "")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ParityConfig:
    """One candidate-vs-reference training run. Fields that do not apply to an engine stay ``None``."""

    engine: str
    """The candidate: ``fsdp1``, ``fsdp2`` or ``ddp``."""
    suite: str = "fsdp_vs_ddp"
    """Which suite (and report section) the configuration belongs to."""
    sharding: str | None = None
    """FSDP1 only: ``full_shard``, ``shard_grad_op``, ``no_shard`` or ``hybrid_shard``."""
    use_orig_params: bool | None = None
    """FSDP1 only."""
    reshard_after_forward: bool | None = None
    """FSDP2 only."""
    hsdp: int | None = None
    """FSDP2 only: HSDP over a 2-D mesh of ``hsdp`` replicas x ``world_size // hsdp`` shards
    (``two_d.py``; ``hsdp2x2`` in the id); ``None``: a 1-D mesh."""
    tp: int | None = None
    """FSDP2 only: tensor parallelism of degree ``tp`` (the workload's ``tp_plan``) on a mesh
    ``world_size // tp`` (dp) x ``tp``, FSDP over dp (``two_d.py``; ``tp2`` in the id)."""
    precision: str = "fp32"
    """``fp32``, or ``fp16``/``bf16``: FSDP mixed precision (param and reduce dtype); the DDP
    reference then trains a copy in that dtype and keeps float32 master weights, as FSDP does."""
    mixed: PrecisionPolicy | None = None
    """The candidate's mixed-precision policy in full (reduce dtype, buffers, input and output
    casts, low-precision grads); ``None``: the engine's default for ``precision``
    (``precision.default``). The reference emulates whichever applies (:attr:`policy`)."""
    recipe: str = "pure"
    """How ``precision`` is applied (``recipe.KINDS``): ``pure`` (FSDP's policy), ``reduce32`` (the
    policy reducing in float32), ``autocast`` (float32 parameters, the forward under
    ``torch.autocast``) or ``mixed`` (the policy and autocast); see ``recipe.py``. A float32
    configuration has no recipe: it is reset to ``pure``, so ``with_(precision="fp32")`` is the
    plain float32 twin of any recipe (the expected gap's run)."""
    optimizer: str = "sgd"
    offload: bool = False
    """FSDP2: ``CPUOffloadPolicy(pin_memory=False)``; FSDP1: ``CPUOffload(offload_params=True)``."""
    workload: str = "mlp"
    """A registered workload name (``mlp``, ``llama``, an entry point's) or ``module:function``
    (``harness.parity.workload.registry``); a string, so a configuration pickles to the ranks, which
    resolve it themselves."""
    path: str = "plain"
    clip: float = 1.0
    """The ``max_norm`` of ``clip_grad_norm_`` on path ``unscale_clip`` (the CLI's ``--clip NORM``);
    named in the id when it is not 1.0, so the rows that clip at 1.0 keep their ids."""
    accumulate: int = 1
    """Microbatches per optimizer step (gradient accumulation, ``ranks/sides/accumulate.py``); named in
    the id when more than 1 (``acc4``)."""
    sync: str = "every"
    """With ``accumulate > 1``: reduce ``every`` microbatch, or only the ``last`` (DDP and FSDP1
    ``no_sync()``, FSDP2 ``set_requires_gradient_sync(False)``; ``synclast`` in the id)."""
    checkpoint: str | None = None
    """Activation checkpointing of the units on both sides (``ranks/sides/checkpoint.py``): ``replay``
    (RNG state preserved), ``no_replay`` (the candidate's recompute draws new dropout masks; the
    reference always replays); ``ckpt``/``ckpt_norng`` in the id."""
    faults: tuple[Fault, ...] = ()
    scaler: str = "ours"
    """The candidate's scaler: ``ours`` (``scaler.ShardedGradScaler``) or ``torch`` (torch's)."""
    reference: str = "ddp"
    world_size: int = 2
    backend: str = "gloo"
    steps: int = 6
    resume_at: int | None = None
    """A resume row: the candidate trains ``resume_at`` steps, saves a checkpoint, drops everything,
    loads it into a fresh model (new random weights) and trains the rest; the reference trains
    straight through (``ranks/restart/resume.py``). ``None``: no resume."""
    resume_method: str | None = None
    """With :attr:`resume_at`: how the checkpoint is written (``resume_spec.METHODS``)."""
    resume_layout: str | None = None
    """With :attr:`resume_at`: the engine layout the candidate comes back in (``resume_spec.LAYOUTS``:
    FSDP1 -> FSDP2, FSDP2 reshard -> keep, DDP -> FSDP2); ``None``: the one it saved in."""
    resume_world_size: int | None = None
    """With :attr:`resume_at`: the world size the candidate comes back at (``w4to2`` in the id:
    saved at ``world_size`` 4, loaded at 2); its reference changes world size with it at the same
    step. Two rank calls, one per world size (``doors/reshard.py``). ``None``: the same one."""
    init_scale: float = 2.0**16
    growth_interval: int = 3
    """Short, so a few steps show growth as well as backoff."""
    seed: int = 0

    def __post_init__(self) -> None:
        _choice("engine", self.engine, ENGINES)
        _choice("suite", self.suite, SUITES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("path", self.path, PATHS)
        _choice("scaler", self.scaler, SCALERS)
        _choice("reference", self.reference, REFERENCES)
        _choice("backend", self.backend, BACKENDS)
        _choice("sync", self.sync, SYNCS)
        _choice("checkpoint", self.checkpoint, CHECKPOINTS)
        self._check_accumulation()
        resume_spec.check(self)
        two_d.check(self)
        if not self.clip > 0:
            raise ValueError(f"clip must be a max norm > 0, got {self.clip}")
        if self.clip != 1.0 and self.path != "unscale_clip":
            raise ValueError(f"clip={self.clip} clips on path='unscale_clip' only, not {self.path!r}")
        if self.precision == "fp32" and self.recipe != "pure":
            object.__setattr__(self, "recipe", "pure")  # frozen: the one normalisation
        recipes.check(self.recipe, self.engine, self.precision, self.mixed)
        if self.mixed is not None:
            if self.mixed.param != self.precision:
                raise ValueError(
                    f"mixed.param must be the configuration's precision {self.precision!r}, got {self.mixed.param!r}"
                )
            self.mixed.check_for(self.engine)
        workload = registry.get(self.workload)
        if self.optimizer == "own" and workload.optimizer is None:
            raise ValueError(
                f"optimizer='own' needs a workload with an optimizer; {workload.name!r} has none "
                "(use e.g. optimizer='sgd')"
            )
        if self.engine == "fsdp1":
            _choice("sharding", self.sharding, FSDP1_SHARDING)
            if self.use_orig_params is None:
                raise ValueError("use_orig_params must be True or False for engine='fsdp1'")
        elif self.sharding is not None or self.use_orig_params is not None:
            raise ValueError(
                f"sharding and use_orig_params apply to engine='fsdp1' only, not {self.engine!r}"
            )
        if self.engine == "fsdp2":
            if self.reshard_after_forward is None:
                raise ValueError("reshard_after_forward must be True or False for engine='fsdp2'")
        elif self.reshard_after_forward is not None:
            raise ValueError(f"reshard_after_forward applies to engine='fsdp2' only, not {self.engine!r}")
        if self.offload and self.engine == "ddp":
            raise ValueError("offload applies to FSDP engines only; use engine='fsdp1' or 'fsdp2'")
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.growth_interval < 1:
            raise ValueError(f"growth_interval must be >= 1, got {self.growth_interval}")
        if not self.init_scale > 0:
            raise ValueError(f"init_scale must be > 0, got {self.init_scale}")
        for fault in self.faults:
            if fault.step >= self.steps:
                raise ValueError(f"fault {fault.id} lies past the last step ({self.steps - 1})")
            if fault.optimizer == 1 and self.path != "two_optimizers":
                raise ValueError(
                    f"fault {fault.id} names optimizer 1 but path={self.path!r} has one optimizer"
                )
        if self.reference == "single" and not registry.get(self.workload).sparse:
            raise ValueError(
                "reference='single' is for the sparse workload ('embedding'); use reference='ddp'"
            )
        if registry.get(self.workload).sparse and self.recipe != "pure":
            raise ValueError(
                "the sparse 'embedding' workload trains in its precision throughout: recipe 'pure' only"
            )
        if registry.get(self.workload).sparse and (self.engine != "ddp" or self.reference != "single"):
            raise ValueError(
                "the sparse 'embedding' workload runs as engine='ddp' against reference='single' "
                "(FSDP does not shard sparse gradients)"
            )

    def _check_accumulation(self) -> None:
        if self.accumulate < 1:
            raise ValueError(f"accumulate must be >= 1 microbatch, got {self.accumulate}")
        if self.accumulate == 1:
            if self.sync != "every":
                raise ValueError(f"sync={self.sync!r} needs accumulate > 1 (one microbatch always syncs)")
            return
        if self.engine == "ddp" or self.reference != "ddp":
            raise ValueError(
                "accumulate > 1 checks an FSDP candidate against its DDP reference (engine='fsdp1' "
                "or 'fsdp2'): DDP's own reducer re-reduces the earlier microbatches' sum"
            )
        if self.mixed is not None and self.mixed.keep_low_precision_grads:
            raise ValueError("accumulate > 1 with keep_low_precision_grads is not emulated by the reference")

    # -- naming -----------------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """Readable and unique: ``fsdp1-full_shard-flat-fp16-adam_fused-w2``,
        ``fsdp2-reshard-offload-bf16-sgd-w2``, ``ddp-fp32-sgd-unscale_clip-inf@r1s2-w2``. A recipe
        other than ``pure`` is named where the precision is: ``fsdp2-reshard-autocast-fp16-sgd-w2``,
        ``fsdp1-full_shard-flat-mixed-bf16-sgd-w2``, ``fsdp2-keep-bf16-reduce32-adam-w2``."""
        parts = [self.engine]
        if self.engine == "fsdp1":
            parts += [self.sharding, "orig" if self.use_orig_params else "flat"]  # type: ignore[list-item]
        parts += two_d.id_parts(self)
        if self.engine == "fsdp2":
            parts.append("reshard" if self.reshard_after_forward else "keep")
        if self.offload:
            parts.append("offload")
        if self.recipe in recipes.AUTOCASTING:
            parts.append(self.recipe)
        parts.append(self.precision)
        if self.recipe == "reduce32":
            parts.append("reduce32")
        if self.mixed is not None and (
            word := self.mixed.word(recipes.policy(self.recipe, self.engine, self.precision, None))
        ):
            parts.append(word)
        parts.append(self.optimizer)
        if self.workload != "mlp":
            parts.append(registry.get(self.workload).name)
        if self.path != "plain":
            parts.append(self.path)
        if self.clip != 1.0:
            parts.append(f"clip{self.clip:g}")
        if self.accumulate > 1:
            parts.append(f"acc{self.accumulate}" + ("-synclast" if self.sync == "last" else ""))
        if self.checkpoint is not None:
            parts.append("ckpt" if self.checkpoint == "replay" else "ckpt_norng")
        parts += [fault.id for fault in self.faults]
        parts += resume_spec.id_parts(self)
        if self.scaler != "ours":
            parts.append(f"{self.scaler}_scaler")
        parts.append(f"w{self.world_size}" + resume_spec.to_world_size(self))
        if self.backend != "gloo":
            parts.append(self.backend)
        return "-".join(parts)

    @property
    def keywords(self) -> frozenset[str]:
        """What ``-k`` matches against: the id's parts, the suite, and ``field=value`` pairs."""
        words = set(self.id.split("-")) | {self.suite, self.id}
        for field in dataclasses.fields(self):
            if field.name not in ("faults", "mixed"):
                words.add(f"{field.name}={getattr(self, field.name)}")
        if any(fault.rank is None for fault in self.faults):
            words.add("every_rank")
        if any(fault.rank is not None for fault in self.faults):
            words.add("one_rank")
        if self.fused:
            words.add("fused")
        if self.resume_at is not None:
            words |= {"resume", f"resume={self.resume_method}"}
        if self.resume_layout is not None:
            words.add("into")
        if self.resume_world_size is not None:
            words |= {"resharded", f"{self.world_size}to{self.resume_world_size}"}
        words |= {self.recipe_name, f"recipe={self.recipe_name}"}
        return frozenset(words)

    @property
    def recipe_name(self) -> str:
        """The recipe as users name it: ``fp32``, ``pure-bf16``, ``fp16-reduce32``, ``autocast-fp16``,
        ``mixed-bf16`` (``recipe.RECIPES``)."""
        return recipes.name(self.recipe, self.precision)

    @property
    def autocast(self) -> str | None:
        """The dtype both sides' forward autocasts to (``fp16``/``bf16``), or ``None``."""
        return self.precision if self.recipe in recipes.AUTOCASTING else None

    @property
    def policy(self) -> PrecisionPolicy | None:
        """The candidate's mixed precision (``None`` in float32): what the FSDP engines apply and
        the low-precision DDP reference emulates, field by field."""
        return recipes.policy(self.recipe, self.engine, self.precision, self.mixed)

    @property
    def fused(self) -> bool:
        if self.optimizer == "own":
            return registry.fused_optimizer(registry.spec_of(self.workload))
        return self.optimizer.endswith("_fused")

    def reference_key(self) -> tuple[object, ...]:
        """Configurations with equal keys share one reference run (the candidate's fields excluded)."""
        return (
            self.reference,
            self.workload,
            self.precision,
            self.policy if self.reference == "ddp" else None,  # FSDP1 and FSDP2 references differ
            self.autocast,
            # the candidate's engine: FSDP2's autograd nodes and each engine's divide factors (twin.py)
            self.engine if self.reference == "ddp" else None,
            self.reduce_layout_key(),
            self.optimizer,
            self.path,
            self.clip,
            self.accumulate,
            self.sync,
            self.checkpoint is not None,  # the reference always replays
            tuple((f.step, f.value, f.optimizer) for f in self.faults),
            self.scaler if self.reference == "single" else "torch.amp",
            self.world_size,
            self.tp,  # whose batch each rank trains, and the TP'd modules the twin splits
            self.backend,
            self.steps,
            self.resume_at is not None,  # a resume row's forward RNG runs on (ranks/restart/resume.py)
            self.resume_world_size,
            self.init_scale,
            self.growth_interval,
            self.seed,
        )

    def reduce_layout_key(self) -> tuple[object, ...]:
        """What of the candidate's gradient buffers the reference mirrors (``ranks/sides/reduce_layout.py``)
        from 3 ranks on: FSDP1's strategy (a reduce-scatter, an all-reduce of the whole flat
        gradient, or HYBRID_SHARD's two stages) and ``use_orig_params`` (its alignment padding).
        A resume row that comes back in another layout adds where it changes and into what.
        Empty at 2 ranks, where every layout sums each element in the same order, so the
        references of the layouts stay one run."""
        if self.world_size <= 2 or self.reference != "ddp":
            return ()
        own: tuple[object, ...] = ()
        if self.engine == "fsdp1":
            stages = self.sharding if self.sharding in ("no_shard", "hybrid_shard") else "reduce_scatter"
            own = (stages, self.use_orig_params)
        if self.hsdp is not None:
            own = ("hsdp", self.hsdp)
        if self.resume_layout is None:
            return own
        return (*own, self.engine, self.resume_at, self.resume_layout)  # another layout from resume_at

    def with_(self, **changes: object) -> ParityConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


# -- where a configuration can run ------------------------------------------------------------------
def unsupported_reason(config: ParityConfig, *, gpus: int = 0) -> str | None:
    """Why ``config`` cannot run here (``None`` when it can): said in the report and the skip."""
    widest = max(config.world_size, config.resume_world_size or 0)
    if config.backend == "nccl" and gpus < widest:
        return f"nccl world size {widest} needs {widest} CUDA GPUs, this machine has {gpus}"
    if config.sharding == "hybrid_shard" and (config.world_size < 4 or config.world_size % 2):
        return (
            "HYBRID_SHARD shards within a node and replicates across nodes, so it needs a 2-D mesh: "
            f"an even world size >= 4, not {config.world_size} (run with --world-size 4)"
        )
    if (reason := two_d.unsupported(config)) is not None:
        return reason
    if config.engine == "fsdp1" and config.offload and config.backend == "gloo":
        return (
            "FSDP1 CPUOffload(offload_params=True) needs an accelerator (pinned memory); the GPU tier runs it"
        )
    if registry.get(config.workload).sparse and config.precision == "fp16" and config.backend == "gloo":
        return "gloo cannot all-reduce fp16 sparse gradients ('cadd_sparse' not implemented for 'Half'); the GPU tier runs it"
    if config.world_size < 2 and any(f.rank not in (None, 0) for f in config.faults):
        return f"a fault on rank {max(f.rank or 0 for f in config.faults)} needs world size >= 2"
    return None


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
