"""What the parity engine runs by default: the embedded matrix, one list per suite.

Why data: the CLI (``python -m harness.parity``), the pytest suites under ``suites/parity`` and the
CI gate all expand the *same* lists below, so a configuration has one id everywhere (the pytest
id, the report row, the ``-k`` filter). The configuration type, its parts and its axes are in
``plan/config/``; a user workload's own matrix is in ``workload.py`` here, a loop's, a resume's
and a 2-D mesh's rows in ``loop.py``, ``resume.py`` and ``two_d.py``.
"""

from __future__ import annotations

import dataclasses

from harness.parity.plan import recipe
from harness.parity.plan.config import (
    FAULT_VALUES,
    FSDP1_SHARDING,
    MATRIX_OPTIMIZERS,
    PRECISIONS,
    Fault,
    Layout,
    Loop,
    ParityConfig,
    Precision,
    Scale,
    unique,
)
from harness.parity.plan.matrices import loop as loop_matrix
from harness.parity.plan.matrices import resume as resume_matrix
from harness.parity.plan.matrices import workload as workload_matrix

FSDP1_FLAT = Layout(sharding="full_shard", use_orig_params=False)
FSDP1_ORIG = Layout(sharding="full_shard", use_orig_params=True)
FSDP2_RESHARD = Layout(reshard_after_forward=True)
"""The layouts most rows of one FSDP engine run under."""


# -- the matrices -----------------------------------------------------------------------------------
def _init_scale(precision: str, world_size: int, backend: str) -> float:
    """fp16 starts high enough that its gradients overflow in the first steps, as real fp16 runs do:
    the scale backs off until they fit, then grows, and every rank must make the same decisions on
    the way, with overflows that may show up in one rank's shard only. Wherever the reference sums
    each element as its candidate does (gloo, at any world size: ``ranks/sides/reduce_layout.py``), the
    partial sums that overflow are the same on both sides. On NCCL the order is not the buffer's
    alone, so a gradient at fp16's edge could overflow in one run and not the other, which is the
    backend's arithmetic and not the scaler's: there the matrix starts at 2**16, away from the edge."""
    exact_reduction = backend == "gloo"
    return 2.0**20 if precision == "fp16" and exact_reduction else 2.0**16


def fsdp_vs_ddp(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """FSDP1 (4 strategies x use_orig_params x precision x optimizer) and FSDP2 (reshard x precision
    x offload x optimizer) against DDP, plus the tied-weight transformer and the frozen model with
    an empty shard on every engine."""
    common = {"world_size": world_size, "backend": backend}
    configs = [
        ParityConfig(
            engine="fsdp1",
            optimizer=opt,
            **common,
            layout=Layout(sharding=s, use_orig_params=o),
            precision=Precision(dtype=p),
            scale=Scale(init_scale=_init_scale(p, world_size, backend)),
        )
        for s in FSDP1_SHARDING
        for o in (False, True)
        for p in PRECISIONS
        for opt in MATRIX_OPTIMIZERS
    ]
    configs += [
        ParityConfig(
            engine="fsdp2",
            optimizer=opt,
            **common,
            layout=Layout(reshard_after_forward=r, offload=off),
            precision=Precision(dtype=p),
            scale=Scale(init_scale=_init_scale(p, world_size, backend)),
        )
        for r in (True, False)
        for p in PRECISIONS
        for off in (False, True)
        for opt in MATRIX_OPTIMIZERS
    ]
    for workload in ("transformer", "frozen"):
        for precision in PRECISIONS:
            configs += [
                ParityConfig(
                    engine="fsdp1",
                    workload=workload,
                    **common,
                    layout=Layout(sharding="full_shard", use_orig_params=orig),
                    precision=Precision(dtype=precision),
                )
                for orig in ((True,) if workload == "frozen" else (False, True))
            ]
            configs.append(
                ParityConfig(
                    engine="fsdp2",
                    workload=workload,
                    **common,
                    layout=Layout(reshard_after_forward=True),
                    precision=Precision(dtype=precision),
                )
            )
    return configs


def recipes(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """A few rows of each recipe beyond ``pure`` (``recipe.py``), FSDP1 and FSDP2 against their twin:
    the MLP with SGD-momentum under each engine, and the tied-weight transformer (LayerNorm,
    softmax, cross-entropy: the ops autocast keeps in float32) under FSDP2 for the autocasting
    recipes. ``--workload NAME`` runs every recipe under every engine."""
    common = {"world_size": world_size, "backend": backend, "optimizer": "sgd"}
    configs = []
    for name in recipe.RECIPES:
        kind, dtype = recipe.parse(name)
        if kind == "pure":
            continue
        mine = Precision(dtype=dtype, recipe=kind)
        scale = Scale(init_scale=_init_scale(dtype, world_size, backend))  # as its pure rows
        configs += [
            ParityConfig(engine="fsdp1", layout=FSDP1_FLAT, precision=mine, scale=scale, **common),
            ParityConfig(engine="fsdp2", layout=FSDP2_RESHARD, precision=mine, scale=scale, **common),
        ]
        if kind in recipe.AUTOCASTING:  # the transformer starts at 2**16, as its pure rows do
            configs.append(
                ParityConfig(
                    engine="fsdp2", workload="transformer", layout=FSDP2_RESHARD, precision=mine, **common
                )
            )
    return configs


def forced_inf(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """inf and NaN on one rank only and on every rank at once, for DDP, FSDP1 and FSDP2 on every
    scaler path. Steps 2 and 6 (of 7) are poisoned; with ``growth_interval=3`` the scale backs off
    at step 2, grows back after the three clean steps 3-5 and backs off again at step 6."""
    engines = [("ddp", Layout()), ("fsdp1", FSDP1_FLAT), ("fsdp2", FSDP2_RESHARD)]
    paths = [("plain", "sgd"), ("plain", "adam_fused"), ("unscale_clip", "sgd"), ("two_optimizers", "sgd")]
    configs = []
    for engine, layout in engines:
        for path, optimizer in paths:
            for rank in (1, None):
                for value in FAULT_VALUES:
                    faults = (Fault(step=2, rank=rank, value=value), Fault(step=6, rank=rank, value=value))
                    configs.append(
                        ParityConfig(
                            suite="forced_inf",
                            optimizer=optimizer,
                            faults=faults,
                            steps=7,
                            world_size=world_size,
                            backend=backend,
                            engine=engine,
                            layout=layout,
                            loop=Loop(path=path),
                            scale=Scale(init_scale=1024.0),
                        )
                    )
    return configs


def sparse(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """DDP with a sparse embedding against one process training on every rank's batch, in each
    precision; step ``registry.OVERFLOW_STEP`` overflows only once duplicates are summed."""
    return [
        ParityConfig(
            suite="sparse",
            engine="ddp",
            reference="single",
            workload="embedding",
            optimizer="sgd_plain" if precision == "fp16" else "sgd",
            world_size=world_size,
            backend=backend,
            precision=Precision(dtype=precision),
            scale=Scale(init_scale=1024.0 if precision == "fp16" else 2.0**16),
        )
        for precision in PRECISIONS
    ]


def cpu_offload(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """Parameters and gradients offloaded to the CPU: FSDP2 ``CPUOffloadPolicy`` (any backend) and
    FSDP1 ``CPUOffload`` (an accelerator is needed), with a forced inf on one rank and without."""
    engines = [("fsdp2", FSDP2_RESHARD), ("fsdp1", FSDP1_ORIG)]
    return [
        ParityConfig(
            suite="cpu_offload",
            optimizer=optimizer,
            faults=faults,
            world_size=world_size,
            backend=backend,
            engine=engine,
            layout=dataclasses.replace(layout, offload=True),
            precision=Precision(dtype=precision),
        )
        for precision in PRECISIONS
        for faults in ((), (Fault(step=2, rank=1),))
        for optimizer in ("sgd", "adam_fused")
        for engine, layout in engines
    ]


def canary(*, world_size: int = 2, backend: str = "gloo") -> list[ParityConfig]:
    """The wiring canary (``workload/builtin/canary.py``: sums exact in any order) under every way
    the engines reduce: DDP's buckets, FSDP1's flat shards with and without alignment, NO_SHARD's
    all-reduce, HYBRID_SHARD's two stages (world size >= 4), FSDP2's chunked reduce-scatter."""
    common = {"world_size": world_size, "backend": backend, "workload": "canary", "optimizer": "own"}
    return [
        ParityConfig(engine="ddp", **common),
        *(
            ParityConfig(engine="fsdp1", **common, layout=Layout(sharding=s, use_orig_params=o))
            for s, o in (
                ("full_shard", False),
                ("full_shard", True),
                ("no_shard", True),
                ("hybrid_shard", True),
            )
        ),
        ParityConfig(engine="fsdp2", **common, layout=Layout(reshard_after_forward=True)),
    ]


def reshard(*, backend: str = "gloo") -> list[ParityConfig]:
    """The resharded resume rows (``make reshard``, ``--reshard``): saved at one world size,
    loaded at another (``resume_matrix.reshard_rows``)."""
    return resume_matrix.reshard_rows(backend=backend, init_scale=_init_scale)


def default_matrix(*, world_size: int = 2, backend: str = "gloo", scaler: str = "ours") -> list[ParityConfig]:
    """Every suite's configurations, and a few rows of each showcase workload (the Llama-style
    decoder and the conv net): what ``python -m harness.parity`` runs by default."""

    configs = [
        *fsdp_vs_ddp(world_size=world_size, backend=backend),
        *recipes(world_size=world_size, backend=backend),
        *loop_matrix.default_rows(world_size=world_size, backend=backend),
        *resume_matrix.default_rows(world_size=world_size, backend=backend, init_scale=_init_scale),
        *forced_inf(world_size=world_size, backend=backend),
        *sparse(world_size=world_size, backend=backend),
        *cpu_offload(world_size=world_size, backend=backend),
        *workload_matrix.showcase(world_size=world_size, backend=backend),
        *canary(world_size=world_size, backend=backend),
    ]
    if scaler != "ours":
        configs = [c.with_(scaler=scaler) for c in configs]
    return unique(configs)
