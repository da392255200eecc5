"""The 2-D layouts a configuration may ask for, checked: HSDP and FSDP2 with tensor parallelism.

Why apart from ``config.py``: a 2-D mesh is one more axis of a configuration with rules of its own
(the world size must split into the mesh, only FSDP2 takes a 2-D mesh here, tensor parallelism
needs the workload's plan), and the configuration type stays a list of fields. Takes the
configuration duck-typed, so the type's module can import this one.

* **HSDP** (``ParityConfig.hsdp = R``): ``fully_shard(mesh=(R, world // R))`` with the mesh
  dimensions named ``("replicate", "shard")``: each gradient reduce-scattered within a shard group,
  then all-reduced across the ``R`` replicas. ``R = world`` is a sharding degree of 1 (every rank
  holds whole parameters; pytorch/pytorch#167178 was a divide factor lost there).
* **FSDP2 + TP** (``ParityConfig.tp = T``): a mesh ``(world // T, T)`` named ``("dp", "tp")``;
  ``parallelize_module(model, mesh["tp"], workload.tp_plan)`` then ``fully_shard(mesh=mesh["dp"])``.
  Every rank of a TP group trains its data-parallel group's batch, so the batch of a rank is that
  of its ``dp`` coordinate (:func:`data_rank`).
"""

from __future__ import annotations

from typing import Any

from harness.parity.workload import registry

TP_DEGREES = (2,)
"""The tensor-parallel degrees the reference can mirror bitwise: a ``RowwiseParallel`` output (and
a ``ColwiseParallel`` input gradient) is a sum of ``T`` partial products across the TP group, and
two addends sum the same in any order, so the reference computes both partials and adds them
(``ranks/sides/tensor_parallel.py``). From three on, the sum's order is the all-reduce's ring and
the reference would have to mirror it."""


def check(config: Any) -> None:
    """Refuse a 2-D layout the engine cannot run, naming the field and the fix."""
    if config.hsdp is not None and config.tp is not None:
        raise ValueError(
            "hsdp and tp are two different 2-D meshes (replicate x shard, dp x tp); a 3-D mesh is "
            "not built: set one of them"
        )
    for field in ("hsdp", "tp"):
        value = getattr(config, field)
        if value is None:
            continue
        if config.engine != "fsdp2":
            raise ValueError(f"{field}={value} is a 2-D mesh for engine='fsdp2', not {config.engine!r}")
        if not isinstance(value, int) or value < 1 or config.world_size % value:
            raise ValueError(
                f"{field} must be a degree that divides world_size {config.world_size}, got {value!r} "
                f"(use one of {[d for d in range(1, config.world_size + 1) if config.world_size % d == 0]})"
            )
        if (
            config.offload
            or config.resume_at is not None
            or config.accumulate > 1
            or config.checkpoint
            or config.path != "plain"
        ):
            raise ValueError(
                f"{field}={value}: the 2-D rows run the plain loop (path 'plain'; no offload, resume, "
                "accumulation or activation checkpointing)"
            )
    if config.hsdp is not None and config.hsdp < 2:
        raise ValueError(
            f"hsdp must be >= 2 replicas (hsdp=1 is plain FSDP2: leave it None), got {config.hsdp}"
        )
    if config.tp is not None:
        if config.tp not in TP_DEGREES:
            raise ValueError(
                f"tp must be one of {TP_DEGREES} (the degrees whose partial sums the reference mirrors "
                f"bitwise), got {config.tp}"
            )
        if registry.get(config.workload).tp_plan is None:
            raise ValueError(
                f"tp={config.tp} needs a workload with a tensor-parallel plan; {config.workload!r} has "
                "none: give it Workload(tp_plan={'layers.*.attention.q': ColwiseParallel(), ...}) or "
                "tp_plan='auto' for a Hugging Face model with base_model_tp_plan"
            )


def mesh_shape(config: Any) -> tuple[tuple[int, int], tuple[str, str]] | None:
    """``((rows, columns), names)`` of the configuration's 2-D mesh, ``None`` for a 1-D one."""
    if config.hsdp is not None:
        return (config.hsdp, config.world_size // config.hsdp), ("replicate", "shard")
    if config.tp is not None:
        return (config.world_size // config.tp, config.tp), ("dp", "tp")
    return None


def data_rank(config: Any, rank: int) -> int:
    """Whose batch ``rank`` trains: its own, or under TP its ``dp`` coordinate's (the mesh is
    row-major, so the ranks ``dp * T .. dp * T + T - 1`` form one TP group and share a batch)."""
    return rank // config.tp if config.tp is not None else rank


def data_parallel_size(config: Any) -> int:
    """Over how many ranks gradients are averaged: the world, or under TP the ``dp`` dimension."""
    return config.world_size // config.tp if config.tp is not None else config.world_size


def id_parts(config: Any) -> list[str]:
    """The words a 2-D layout adds to an id, after the engine's: ``hsdp2x2``, ``hsdp4x1``, ``tp2``."""
    if config.hsdp is not None:
        return [f"hsdp{config.hsdp}x{config.world_size // config.hsdp}"]
    if config.tp is not None:
        return [f"tp{config.tp}"]
    return []


def unsupported(config: Any) -> str | None:
    """Why a 2-D configuration cannot run here (``None`` when it can)."""
    if (config.hsdp is not None or config.tp is not None) and config.world_size < 4:
        return (
            f"a 2-D mesh ({' x '.join(id_parts(config))}) needs a world size of at least 4, not "
            f"{config.world_size} (run with --world-size 4)"
        )
    return None
