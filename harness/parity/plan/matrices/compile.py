"""The compiled rows (``--compile block|whole``, ``make compile``): each engine and its twin,
both compiled the same way.

Why a matrix of its own: inductor compiles for seconds per graph on two cores (a 3-block MLP,
both sides, both ranks: about 35 s uncached), so compiled rows are a tier apart from the
2-rank matrix (``make compile``), and ``make test`` runs a fixed sample with ``aot_eager``
(:func:`sample`). The axes: every engine (DDP, FSDP1 with flat and with original parameters,
FSDP2 resharding after forward), float32 and, for FSDP, bf16 (the twin's emulated policy compiled
too; as in the embedded matrix, DDP is a float32 candidate),
SGD with momentum and AdamW (the optimizer torchtitan's compiled recipes train with).
"""

from __future__ import annotations

from harness.parity.plan.config import Compile, Layout, ParityConfig, Precision
from harness.parity.workload import registry

ENGINES = (
    ("ddp", Layout()),
    ("fsdp1", Layout(sharding="full_shard", use_orig_params=False)),
    ("fsdp1", Layout(sharding="full_shard", use_orig_params=True)),
    ("fsdp2", Layout(reshard_after_forward=True)),
)
"""Each candidate engine in the layout most of its rows run under."""
PRECISIONS = ("fp32", "bf16")
OPTIMIZERS = ("sgd", "adamw")
STEPS = 4
"""Steps per compiled row: a compiled run's first step compiles, the later ones show whether the
compiled kernels keep the twins bitwise (an eager twin leaves them at step 2, design 4.7)."""


def rows(
    *,
    mode: str,
    compile_backend: str = "inductor",
    twin: str = "compiled",
    workload: str = "mlp",
    world_size: int = 2,
    backend: str = "gloo",
) -> list[ParityConfig]:
    """``workload``'s compiled rows: every engine of :data:`ENGINES` x precision x optimizer, the
    candidate and its twin compiled in ``mode`` (``block``, ``whole``) with ``compile_backend``
    (``twin="eager"``: the reference left eager, so that compile's own difference shows)."""
    spec = registry.get(workload)
    part = Compile(mode=mode, backend=compile_backend, twin=twin)
    return [
        ParityConfig(
            engine=engine,
            layout=layout,
            workload=workload,
            optimizer=optimizer,
            precision=Precision(dtype=precision),
            world_size=world_size,
            backend=backend,
            steps=spec.steps or STEPS,
            compile=part,
        )
        for engine, layout in ENGINES
        for precision in PRECISIONS
        for optimizer in OPTIMIZERS
        if engine != "ddp" or precision == "fp32"  # a bf16 DDP candidate has no float32 masters: no twin
    ]


TIER_WORKLOADS = ("mlp", "transformer")
"""What ``make compile`` compiles: the MLP (linears and ReLU, which inductor leaves to the same
matmul kernels: even an eager twin stays bitwise) and the tied-weight transformer (LayerNorm,
softmax, GELU: fused by inductor, so an eager twin differs from step 0 and only the compiled twin
is bitwise)."""


def sample() -> list[ParityConfig]:
    """The fixed ``aot_eager`` sample: FSDP2 per block and FSDP1 (original parameters) whole,
    float32, AdamW (the graphs traced and run by eager kernels: seconds to compile). ``make test``
    runs the per-block row (``suites/parity/test_compile.py``); the row compiled whole is the
    ``compile`` tier's."""
    block = rows(mode="block", compile_backend="aot_eager")
    whole = rows(mode="whole", compile_backend="aot_eager")
    return [
        *(c for c in block if c.engine == "fsdp2" and c.precision.dtype == "fp32" and c.optimizer == "adamw"),
        *(
            c
            for c in whole
            if c.engine == "fsdp1"
            and c.layout.use_orig_params
            and c.precision.dtype == "fp32"
            and c.optimizer == "adamw"
        ),
    ]
