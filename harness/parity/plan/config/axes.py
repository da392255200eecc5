"""The values each field of a configuration may take, and the check that names the field.

Why apart: every part of a configuration (``layout``, ``mesh``, ``precision``, ``loop``, ``resume``,
``scale``) and the matrices that build them draw from these lists, and the message a bad value
gets names the field and the allowed values the same way everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable

ENGINES = ("ddp", "fsdp1", "fsdp2", "user")
"""``user``: the workload's own ``parallelize`` function (``ranks/sides/user``), as written."""
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
"""When gradient accumulation reduces: every microbatch, or only the last (``no_sync()``)."""
CHECKPOINTS = (None, "replay", "no_replay")
"""Activation checkpointing of the units: none, with the RNG state replayed in the recompute
(``preserve_rng_state=True``), or without (a bug under dropout)."""
FAULT_VALUES = ("inf", "nan")
COMPILE_MODES = (None, "block", "whole", "function")
"""``torch.compile`` of the model on both sides: none, every innermost FSDP unit, the whole model;
``function``: as a user's ``parallelize`` function compiles it (engine ``user``, with an eager twin)."""
COMPILE_BACKENDS = ("inductor", "aot_eager")
"""The ``torch.compile`` backends a row compiles with (``plan/config/compile.py``)."""
COMPILE_TWINS = ("compiled", "eager")
"""The reference of a compiled candidate: compiled the same way (its twin), or eager (compile's own
difference, which the twin hides, shows)."""


def choice(name: str, value: object, allowed: Iterable[object]) -> None:
    """``ValueError`` naming ``name`` and the allowed values when ``value`` is not one of them."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
