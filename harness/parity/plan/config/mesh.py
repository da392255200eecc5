"""The device mesh a configuration asks for, checked: 1-D, HSDP, or FSDP2 with tensor parallelism.

Why a part: a 2-D mesh is one more axis of a configuration with rules of its own (the world size
must split into the mesh, only FSDP2 takes a 2-D mesh here, tensor parallelism needs the
workload's plan); the mesh owns them, its words in the id and its share of the reference key.

* **HSDP** (``Mesh(hsdp=R)``): ``fully_shard(mesh=(R, world // R))`` with the mesh dimensions
  named ``("replicate", "shard")``: each gradient reduce-scattered within a shard group, then
  all-reduced across the ``R`` replicas. ``R = world`` is a sharding degree of 1 (every rank holds
  whole parameters; pytorch/pytorch#167178 was a divide factor lost there).
* **FSDP2 + TP** (``Mesh(tp=T)``): a mesh ``(world // T, T)`` named ``("dp", "tp")``;
  ``parallelize_module(model, mesh["tp"], workload.tp_plan)`` then ``fully_shard(mesh=mesh["dp"])``.
  Every rank of a TP group trains its data-parallel group's batch, so the batch of a rank is that
  of its ``dp`` coordinate (:meth:`Mesh.data_rank`).
* **FSDP2 + PP** (``Mesh(pp=P, schedule="1f1b", microbatches=M)``): a mesh ``P`` (pp) x
  ``world_size // P`` (dp) named ``("pp", "dp")``; the workload's model cut into stages at its
  ``pp_split`` (``sides/pipeline/``), each stage ``fully_shard``-ed over ``dp`` and run by
  torch's schedule over ``M`` microbatches. Every stage of a ``dp`` coordinate trains that
  coordinate's batch (:meth:`Mesh.data_rank`).
* **The user's own** (``Mesh(dims=(("dp", 2), ("tp", 2)))``, engine ``user``): the mesh handed to
  the workload's ``parallelize`` function, its dimensions named and sized as the user's code reads
  them (``--mesh dp=2,tp=2``; by default one dimension ``dp`` over every rank). A dimension named
  ``tp`` is tensor parallel (its ranks share a batch), one named ``pp`` holds the stages of the
  pipeline the function builds (they share a batch too); every other one is data parallel.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harness.parity.workload import registry
from harness.torch_private import pipelining

if TYPE_CHECKING:
    from harness.parity.plan.config import ParityConfig
    from harness.parity.plan.precision import PrecisionPolicy

SCHEDULES: dict[str, tuple[str, int]] = {
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved1f1b": ("ScheduleInterleaved1F1B", 2),
    "looped_bfs": ("ScheduleLoopedBFS", 2),
    "interleaved_zb": ("ScheduleInterleavedZeroBubble", 2),
    "zbv": ("ScheduleZBVZeroBubble", 2),
    "dualpipev": ("ScheduleDualPipeV", 2),
}
"""``--schedule`` name: (torch's class in ``torch.distributed.pipelining``, stages per rank).
The multi-stage schedules hold two stages per rank: looped (rank ``r``: stages ``r`` and
``r + pp``), or in a V (``zbv``, ``dualpipev``: ``r`` and ``2 pp - 1 - r``)."""


DESCENDING = frozenset({"looped_bfs"})
"""Schedules whose stages back-propagate the microbatches last first (torch 2.13's
``ScheduleLoopedBFS``: ``reversed(range(n_microbatches))``); every other one goes first first."""


SPLIT_BACKWARD = frozenset({"interleaved_zb", "zbv", "dualpipev"})
"""Schedules that cut a stage's backward in two: input gradients first (``I``), weight gradients
later (``W``: ``stage_backward_weight``, which adds each microbatch's into ``param.grad`` itself,
outside FSDP2's accumulation)."""


def pipeline_unsupported(config: ParityConfig) -> str | None:
    """Why a pipeline row is not checked here (``None``: it is): a schedule the installed torch
    cannot run over the row's backend (``torch_private.pipelining.unsupported``), DualPipeV over
    fewer microbatches than stages (torch refuses it)."""
    mesh = config.mesh
    if mesh.pp is not None and (
        reason := pipelining.unsupported(SCHEDULES[mesh.schedule][0], config.backend)
    ):
        return reason
    if mesh.pp is not None and mesh.schedule == "dualpipev" and mesh.microbatches < 2 * mesh.pp:
        return (
            f"torch 2.13's DualPipeV needs at least as many microbatches as stages ({2 * mesh.pp}), "
            f"got {mesh.microbatches}: run it with --microbatches {2 * mesh.pp} or more"
        )
    return None


def check_pipeline(mesh: Mesh, config: ParityConfig) -> None:
    """A pipeline's schedule, microbatches and workload, each refused naming the fix."""
    if mesh.pp is None:
        return
    if mesh.schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(SCHEDULES)}, got {mesh.schedule!r}")
    if not isinstance(mesh.pp, int) or mesh.pp < 2:
        raise ValueError(f"pp must be >= 2 stages (pp=1 is no pipeline: leave it None), got {mesh.pp!r}")
    if not isinstance(mesh.microbatches, int) or mesh.microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {mesh.microbatches!r}")
    spec = registry.get(config.workload)
    if spec.pp_split is None:
        raise ValueError(
            f"pp={mesh.pp} needs a workload that can be cut into stages; {config.workload!r} has no "
            "pp_split: give it Workload(pp_split='auto' or ['layers.1', ...], pp_io=..., pp_loss=...)"
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Mesh:
    """A 1-D mesh over every rank (both ``None``), or one of two 2-D meshes."""

    hsdp: int | None = None
    """FSDP2 only: HSDP over ``hsdp`` replicas x ``world_size // hsdp`` shards (``hsdp2x2`` in the id)."""
    tp: int | None = None
    """FSDP2 only: tensor parallelism of degree ``tp`` (the workload's ``tp_plan``) on a mesh
    ``world_size // tp`` (dp) x ``tp``, FSDP over dp (``tp2`` in the id)."""

    pp: int | None = None
    """FSDP2 only: pipeline parallelism over ``pp`` ranks (``pp2-1f1b-mb4`` in the id), FSDP over
    the ``world_size // pp`` ranks of each stage."""
    schedule: str = "1f1b"
    """The pipeline schedule (:data:`SCHEDULES`); read when ``pp`` is set."""
    microbatches: int = 4
    """How many microbatches the schedule cuts each batch into; read when ``pp`` is set."""

    dims: tuple[tuple[str, int], ...] | None = None
    """Engine ``user`` only: the user's mesh, ``((name, size), ...)`` in row-major order."""

    def __post_init__(self) -> None:
        if self.dims is not None:  # frozen: the one normalisation (parity.json reads back lists)
            object.__setattr__(self, "dims", tuple((str(n), int(s)) for n, s in self.dims))

    @property
    def user_stages(self) -> int | None:
        """The size of a user's mesh's ``pp`` dimension: their function builds a pipeline's stages
        (``sides/user/pipeline.py``); ``None`` without one."""
        return dict(self.dims).get("pp") if self.dims is not None else None

    @property
    def two_d(self) -> bool:
        return self.hsdp is not None or self.tp is not None

    def check_dims(self, config: ParityConfig) -> None:
        """The user's mesh: for engine ``user`` only, sizes that multiply to the world size, names
        that are identifiers, a TP degree the reference mirrors, no pipeline or context dimension."""
        if self.dims is None:
            if config.engine == "user":
                raise ValueError(
                    "engine='user' needs the mesh it hands the function: Mesh(dims=(('dp', 2),))"
                )
            return
        if config.engine != "user" or self.two_d:
            raise ValueError(
                f"dims={self.dims!r} is the mesh of a parallelize function (engine='user'); the built-in "
                "engines take hsdp= or tp="
            )
        names = [name for name, _ in self.dims]
        if len(set(names)) != len(names) or not all(isinstance(n, str) and n.isidentifier() for n in names):
            raise ValueError(
                f"mesh dimension names must be distinct identifiers, got {names!r} (e.g. dp=2,tp=2)"
            )
        product = 1
        for name, size in self.dims:
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"mesh dimension {name!r} must have a size >= 1, got {size!r}")
            product *= size
        if product != config.world_size:
            raise ValueError(
                f"the mesh {self.words()} holds {product} ranks, not the world size {config.world_size}: "
                "make its sizes multiply to the world size"
            )
        if "cp" in names and config.backend == "gloo":
            raise ValueError(
                "a 'cp' mesh dimension (context parallelism) cannot run on CPU: torch 2.13's "
                "context_parallel registers ring attention for the CUDA attention kernels only (on CPU, "
                "scaled_dot_product_attention fails with 'aten._scaled_dot_product_flash_attention_for_cpu"
                ".default does not have a sharding strategy registered'); check it with --backend nccl on GPUs"
            )
        if "cp" in names:
            raise ValueError(
                "a 'cp' mesh dimension (context parallelism) is not checked on GPUs yet: its twin would have "
                "to attend block by block in the ring's order (ring attention rescales each block's partial "
                "output as its softmax grows), and it was never built or measured against torch's CUDA "
                "kernels; the reference mirrors data, tensor and pipeline parallelism: check the rest of "
                "your layout with the cp ranks given to dp (e.g. --mesh dp=4 for cp=2,dp=2)"
            )
        if "pp" in names and dict(self.dims)["pp"] < 2:
            raise ValueError(
                f"a 'pp' mesh dimension needs at least 2 stages, got {self.words()}: use e.g. --mesh pp=2,dp=2"
            )

    def words(self) -> str:
        """The user's mesh as the CLI writes it: ``dp=2,tp=2``."""
        return ",".join(f"{name}={size}" for name, size in self.dims or ())

    @staticmethod
    def parse(text: str) -> tuple[tuple[str, int], ...]:
        """``dp=2,tp=2`` as ``(("dp", 2), ("tp", 2))`` (a ValueError naming ``--mesh`` otherwise)."""
        dims = []
        for part in text.split(","):
            name, _, size = part.strip().partition("=")
            if not name or not size.strip().isdigit():
                raise ValueError(
                    f"--mesh takes name=size pairs separated by commas (dp=2,tp=2), got {text!r}"
                )
            dims.append((name.strip(), int(size)))
        return tuple(dims)

    def check(self, config: ParityConfig) -> None:
        """Refuse a 2-D layout the engine cannot run, naming the field and the fix."""
        self.check_dims(config)
        if self.hsdp is not None and (self.tp is not None or self.pp is not None):
            raise ValueError(
                "hsdp is a 2-D mesh of its own (replicate x shard); with tp or pp it is not built: set "
                "hsdp alone, or tp, pp, or both (pp x dp x tp)"
            )
        if self.pp is not None and self.tp is not None and config.world_size % (self.pp * self.tp):
            raise ValueError(
                f"pp={self.pp} x tp={self.tp} needs a world size their product divides, not {config.world_size}"
            )
        check_pipeline(self, config)
        for field in ("hsdp", "tp", "pp"):
            value = getattr(self, field)
            if value is None:
                continue
            if config.engine != "fsdp2":
                raise ValueError(f"{field}={value} is a 2-D mesh for engine='fsdp2', not {config.engine!r}")
            world = config.world_size
            if not isinstance(value, int) or value < 1 or world % value:
                raise ValueError(
                    f"{field} must be a degree that divides world_size {world}, got {value!r} "
                    f"(use one of {[d for d in range(1, world + 1) if world % d == 0]})"
                )
            loop = config.loop
            if (
                config.layout.offload
                or config.resume.at is not None
                or loop.accumulate > 1
                or loop.checkpoint
                or loop.path != "plain"
            ):
                raise ValueError(
                    f"{field}={value}: the 2-D rows run the plain loop (path 'plain'; no offload, resume, "
                    "accumulation or activation checkpointing)"
                )
        if self.hsdp is not None and self.hsdp < 2:
            raise ValueError(
                f"hsdp must be >= 2 replicas (hsdp=1 is plain FSDP2: leave it None), got {self.hsdp}"
            )
        if self.tp is not None:
            if self.tp < 2:
                raise ValueError(
                    f"tp must be >= 2 (tp=1 is no tensor parallelism: leave it None), got {self.tp}"
                )
            if registry.get(config.workload).tp_plan is None:
                raise ValueError(
                    f"tp={self.tp} needs a workload with a tensor-parallel plan; {config.workload!r} has "
                    "none: give it Workload(tp_plan={'layers.*.attention.q': ColwiseParallel(), ...}) or "
                    "tp_plan='auto' for a Hugging Face model with base_model_tp_plan"
                )

    def shape(self, world_size: int) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """``(sizes, names)`` of the 2-D mesh (3-D: pp x dp x tp), ``None`` for a 1-D one."""
        if self.pp is not None and self.tp is not None:
            return (self.pp, world_size // (self.pp * self.tp), self.tp), ("pp", "dp", "tp")
        if self.pp is not None:
            return (self.pp, world_size // self.pp), ("pp", "dp")
        if self.hsdp is not None:
            return (self.hsdp, world_size // self.hsdp), ("replicate", "shard")
        if self.tp is not None:
            return (world_size // self.tp, self.tp), ("dp", "tp")
        return None

    def data_rank(self, rank: int, world_size: int | None = None) -> int:
        """Whose batch ``rank`` trains: its own, or under TP its ``dp`` coordinate's (the mesh is
        row-major, so the ranks ``dp * T .. dp * T + T - 1`` form one TP group and share a batch).
        On a user's mesh: the rank's index over its data-parallel dimensions (every one but ``tp``
        and ``pp``: the stages of a pipeline share a batch)."""
        if self.dims is not None:
            index, rest = 0, rank
            coords = []
            for _, size in reversed(self.dims):  # row-major: the last dimension varies fastest
                coords.append(rest % size)
                rest //= size
            coords.reverse()
            for (name, size), coord in zip(self.dims, coords, strict=True):
                if name not in ("tp", "pp"):
                    index = index * size + coord
            return index
        if self.pp is not None:  # row-major (pp, dp): the ranks of one stage are consecutive
            assert world_size is not None, "a pipeline's batch follows its dp coordinate: pass the world size"
            tp = self.tp or 1
            return (rank // tp) % (world_size // (self.pp * tp))
        return rank // self.tp if self.tp is not None else rank

    def data_parallel_size(self, world_size: int) -> int:
        """Over how many ranks gradients are averaged: the world, or under TP the ``dp`` dimension
        (on a user's mesh: the product of every dimension but ``tp`` and ``pp``)."""
        if self.dims is not None:
            size = 1
            for name, extent in self.dims:
                size *= extent if name not in ("tp", "pp") else 1
            return size
        if self.pp is not None:
            return world_size // (self.pp * (self.tp or 1))
        return world_size // self.tp if self.tp is not None else world_size

    def id_parts(self, world_size: int) -> list[str]:
        """The words a 2-D layout adds to an id, after the engine's: ``hsdp2x2``, ``hsdp4x1``, ``tp2``;
        a user's mesh: ``dp2xtp2``."""
        if self.dims is not None:
            return ["x".join(f"{name}{size}" for name, size in self.dims)]
        if self.hsdp is not None:
            return [f"hsdp{self.hsdp}x{world_size // self.hsdp}"]
        parts = [f"pp{self.pp}", self.schedule, f"mb{self.microbatches}"] if self.pp is not None else []
        return parts + ([f"tp{self.tp}"] if self.tp is not None else [])

    def unsupported(self, world_size: int) -> str | None:
        """Why the mesh cannot run at ``world_size`` (``None`` when it can)."""
        if self.pp is not None and world_size % self.pp:
            return f"pp={self.pp} stages need a world size they divide, not {world_size}"
        if self.two_d and world_size < 4:
            return (
                f"a 2-D mesh ({' x '.join(self.id_parts(world_size))}) needs a world size of at least 4, "
                f"not {world_size} (run with --world-size 4)"
            )
        return None

    def reduce_layout_key(self) -> tuple[object, ...]:
        """HSDP's two stages, which the reference mirrors from 3 ranks on (a user's mesh: its
        dimensions; the layout itself is read on the ranks)."""
        if self.dims is not None:
            return ("user", self.dims)
        if self.pp is not None:  # each stage's buckets, reduced over its dp group
            return ("pp", self.pp, self.tp)
        return ("hsdp", self.hsdp) if self.hsdp is not None else ()

    def pipeline_key(self, policy: PrecisionPolicy | None) -> tuple[object, ...]:
        """What of a pipeline its reference mirrors: the stages (their buckets, whose batch each
        rank trains), the microbatches, the order the schedule adds them in (:data:`DESCENDING`),
        and, where a split backward sums some of them in the parameters' dtype before the reduce
        dtype (``policy``'s differ), the schedule itself (``sides/pipeline/halves.py``)."""
        if self.pp is None:
            return ()
        split = self.schedule in SPLIT_BACKWARD and policy is not None and policy.reduce_dtype != policy.param
        return (self.pp, self.microbatches, self.schedule in DESCENDING, self.schedule if split else None)
