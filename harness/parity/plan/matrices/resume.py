"""Resume rows: the candidate saves at a step, comes back in a fresh model and trains on, against a
reference that trains straight through (``ranks/restart/resume.py``).

Why a few rows of their own: a resume is one more axis of the same question (does the run that
stopped and came back train exactly like the one that did not), and each checkpoint method must
restore the model, the optimizer, the scaler, the RNG and the step count under each engine. The
default matrix runs both of our methods under FSDP1 and FSDP2, in float32 with Adam (whose step
count enters its bias correction) and in fp16 with SGD-momentum (whose scale has backed off and
grown by the resume, so a scaler that is not restored shows), and the conv net with dropout (whose
masks come from the RNG the checkpoint must restore). A workload's matrix adds them when the user
asks (``--resume-at``) or declares ``save``/``load`` (then its own method too).
"""

from __future__ import annotations

from collections.abc import Callable

from harness.parity.plan.config import Layout, ParityConfig, Precision, Resume, Scale
from harness.parity.workload import registry
from harness.parity.workload.spec import WorkloadError

LAYOUTS: tuple[tuple[str, Layout], ...] = (
    ("fsdp1", Layout(sharding="full_shard", use_orig_params=False)),
    ("fsdp2", Layout(reshard_after_forward=True)),
)
"""The engine layouts a resume row runs under: FSDP1's flat shards and FSDP2's DTensors."""

METHODS = ("dcp", "sharded_optimizer")
"""Our methods; a workload that declares ``save``/``load`` adds ``user``."""

RECIPES = (("fp32", "adam"), ("fp16", "sgd"))
"""``(precision, optimizer)`` of the default rows."""


RELAYOUTS: tuple[tuple[tuple[str, Layout], str, str], ...] = (
    (LAYOUTS[0], "fully_shard", "adam"),
    (LAYOUTS[1], "fully_shard_keep", "adam"),
    (("ddp", Layout()), "fully_shard", "sgd"),
)
"""``(saved in, resumed in, optimizer)``: rows that come back in another layout at the same world
size (FSDP1 -> FSDP2, FSDP2 reshard -> keep, DDP -> FSDP2), float32 (one reference for both)."""


WORLD_SIZE_CHANGES = ((4, 2), (2, 4))
"""``(saved at, resumed at)`` of the resharded rows (``make reshard``)."""


def reshard_rows(
    *, backend: str = "gloo", init_scale: Callable[[str, int, str], float]
) -> list[ParityConfig]:
    """Rows saved at one world size and loaded at another (:data:`WORLD_SIZE_CHANGES`): FSDP2
    through both of our methods, FSDP1 through DCP (the name-keyed method keeps its flat shards in
    a file per rank, which no other world size reads), float32 with Adam and fp16 with
    SGD-momentum through the scaler. Their own tier: each runs two rank calls, one per world size."""
    return [
        ParityConfig(
            engine=engine,
            layout=layout,
            optimizer=optimizer,
            world_size=saved,
            backend=backend,
            precision=Precision(dtype=precision),
            resume=Resume(at=default_step(6), method=method, world_size=resumed),
            scale=Scale(init_scale=init_scale(precision, saved, backend)),
        )
        for saved, resumed in WORLD_SIZE_CHANGES
        for engine, layout in LAYOUTS
        for method in METHODS
        if method == "dcp" or engine == "fsdp2"
        for precision, optimizer in RECIPES
    ]


def default_step(steps: int) -> int:
    """Where a resume row saves when the caller does not say: halfway."""
    return max(1, steps // 2)


def default_rows(
    *, world_size: int = 2, backend: str = "gloo", init_scale: Callable[[str, int, str], float]
) -> list[ParityConfig]:
    """The default matrix's resume rows (``init_scale``: the matrix's, per precision)."""
    at = default_step(6)
    common = {"world_size": world_size, "backend": backend}
    configs = [
        ParityConfig(
            engine=engine,
            layout=layout,
            optimizer=optimizer,
            precision=Precision(dtype=precision),
            resume=Resume(at=at, method=method),
            scale=Scale(init_scale=init_scale(precision, world_size, backend)),
            **common,  # type: ignore[arg-type]
        )
        for method in METHODS
        for engine, layout in LAYOUTS
        for precision, optimizer in RECIPES
    ]
    configs.append(
        ParityConfig(
            engine="fsdp2",
            workload="convnet",
            layout=Layout(reshard_after_forward=True),
            resume=Resume(at=at, method="dcp"),
            **common,  # type: ignore[arg-type]
        )
    )
    configs += [
        ParityConfig(
            engine=engine,
            layout=layout,
            optimizer=optimizer,
            resume=Resume(at=at, method="dcp", layout=into),
            **common,  # type: ignore[arg-type]
        )
        for (engine, layout), into, optimizer in RELAYOUTS
    ]
    return configs


def workload_rows(
    workload: str,
    *,
    steps: int,
    common: dict[str, object],
    optimizers: tuple[str, ...],
    resume_at: int | None,
) -> list[ParityConfig]:
    """A workload's resume rows: every method (the user's own when it declares ``save``/``load``)
    under both layouts, in float32 and fp16, with each of its optimizers; none unless ``resume_at``
    is given or the workload declares ``save``/``load`` (then at :func:`default_step`).
    ``common``: the rows' core fields and scale (``workload``, ``world_size``, ``backend``, ...)."""
    spec = registry.get(workload)
    if resume_at is None and spec.save is None:
        return []
    at = default_step(steps) if resume_at is None else resume_at
    if not (isinstance(at, int) and 1 <= at < steps):
        raise WorkloadError(
            f"resume_at must be a step between 1 and {steps - 1} for workload {spec.name!r} "
            f"({steps} steps: the candidate trains that many before it saves), got {resume_at!r}"
        )
    methods = (*METHODS, "user") if spec.save is not None else METHODS
    return [
        ParityConfig(
            engine=engine,
            layout=layout,
            optimizer=optimizer,
            precision=Precision(dtype=precision),
            resume=Resume(at=at, method=method),
            **common,  # type: ignore[arg-type]
        )
        for method in methods
        for engine, layout in LAYOUTS
        for precision in ("fp32", "fp16")
        for optimizer in optimizers
    ]
