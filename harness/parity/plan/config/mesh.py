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
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from harness.parity.workload import registry

if TYPE_CHECKING:
    from harness.parity.plan.config import ParityConfig

TP_DEGREES = (2,)
"""The tensor-parallel degrees the reference can mirror bitwise: a ``RowwiseParallel`` output (and
a ``ColwiseParallel`` input gradient) is a sum of ``T`` partial products across the TP group, and
two addends sum the same in any order, so the reference computes both partials and adds them
(``ranks/sides/tensor_parallel.py``). From three on, the sum's order is the all-reduce's ring and
the reference would have to mirror it."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Mesh:
    """A 1-D mesh over every rank (both ``None``), or one of two 2-D meshes."""

    hsdp: int | None = None
    """FSDP2 only: HSDP over ``hsdp`` replicas x ``world_size // hsdp`` shards (``hsdp2x2`` in the id)."""
    tp: int | None = None
    """FSDP2 only: tensor parallelism of degree ``tp`` (the workload's ``tp_plan``) on a mesh
    ``world_size // tp`` (dp) x ``tp``, FSDP over dp (``tp2`` in the id)."""

    @property
    def two_d(self) -> bool:
        return self.hsdp is not None or self.tp is not None

    def check(self, config: ParityConfig) -> None:
        """Refuse a 2-D layout the engine cannot run, naming the field and the fix."""
        if self.hsdp is not None and self.tp is not None:
            raise ValueError(
                "hsdp and tp are two different 2-D meshes (replicate x shard, dp x tp); a 3-D mesh is "
                "not built: set one of them"
            )
        for field in ("hsdp", "tp"):
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
            if self.tp not in TP_DEGREES:
                raise ValueError(
                    f"tp must be one of {TP_DEGREES} (the degrees whose partial sums the reference mirrors "
                    f"bitwise), got {self.tp}"
                )
            if registry.get(config.workload).tp_plan is None:
                raise ValueError(
                    f"tp={self.tp} needs a workload with a tensor-parallel plan; {config.workload!r} has "
                    "none: give it Workload(tp_plan={'layers.*.attention.q': ColwiseParallel(), ...}) or "
                    "tp_plan='auto' for a Hugging Face model with base_model_tp_plan"
                )

    def shape(self, world_size: int) -> tuple[tuple[int, int], tuple[str, str]] | None:
        """``((rows, columns), names)`` of the 2-D mesh, ``None`` for a 1-D one."""
        if self.hsdp is not None:
            return (self.hsdp, world_size // self.hsdp), ("replicate", "shard")
        if self.tp is not None:
            return (world_size // self.tp, self.tp), ("dp", "tp")
        return None

    def data_rank(self, rank: int) -> int:
        """Whose batch ``rank`` trains: its own, or under TP its ``dp`` coordinate's (the mesh is
        row-major, so the ranks ``dp * T .. dp * T + T - 1`` form one TP group and share a batch)."""
        return rank // self.tp if self.tp is not None else rank

    def data_parallel_size(self, world_size: int) -> int:
        """Over how many ranks gradients are averaged: the world, or under TP the ``dp`` dimension."""
        return world_size // self.tp if self.tp is not None else world_size

    def id_parts(self, world_size: int) -> list[str]:
        """The words a 2-D layout adds to an id, after the engine's: ``hsdp2x2``, ``hsdp4x1``, ``tp2``."""
        if self.hsdp is not None:
            return [f"hsdp{self.hsdp}x{world_size // self.hsdp}"]
        if self.tp is not None:
            return [f"tp{self.tp}"]
        return []

    def unsupported(self, world_size: int) -> str | None:
        """Why the mesh cannot run at ``world_size`` (``None`` when it can)."""
        if self.two_d and world_size < 4:
            return (
                f"a 2-D mesh ({' x '.join(self.id_parts(world_size))}) needs a world size of at least 4, "
                f"not {world_size} (run with --world-size 4)"
            )
        return None

    def reduce_layout_key(self) -> tuple[object, ...]:
        """HSDP's two stages, which the reference mirrors from 3 ranks on."""
        return ("hsdp", self.hsdp) if self.hsdp is not None else ()
