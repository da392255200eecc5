"""The models a cost curve checks (``cost_curve.py``): Hugging Face ``LlamaForCausalLM`` slices from
1M to 300M parameters, and a user's own ``parallelize`` function over them.

Why these: a Llama is what users check, its parameter count is set by four numbers, and it runs on
a CPU in seconds to minutes. Every workload is resolved by its spec (``spec("10M")``), on the
ranks and in the single process alike, so all sides train the same model from the same seed; the
resolution imports what the workload's callables use (``transformers``' Llama module takes 0.7-1.7 s
to import here), since every side resolves before its clock starts and none should time an import.
"""

from __future__ import annotations

from typing import Any

SIZES: dict[str, tuple[int, int, int]] = {
    "1M": (128, 2, 1024),
    "10M": (384, 4, 4096),
    "50M": (768, 6, 8192),
    "185M": (1024, 12, 16384),
    "300M": (1536, 9, 16384),
}
"""Size -> (hidden, layers, vocabulary); untied head, intermediate 8/3 of hidden (0.7M, 10.2M,
55.1M, 184.5M and 305.4M parameters)."""
DEFAULT_SIZES = ("1M", "10M")
STEPS = 6
BATCH, SEQ = 4, 64
_SIDE_TIMEOUT_S = 1800


def _llama(size: str) -> Any:
    import torch
    import transformers

    from harness.parity import Workload

    hidden, layers, vocab = SIZES[size]
    model_class = transformers.LlamaForCausalLM  # imported now: no side's clock pays the import
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=-(-hidden * 8 // 3 // 8) * 8,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    return Workload(
        name=f"llama_{size}",
        model=lambda: model_class(config),
        batch=lambda rank, step: torch.randint(0, vocab, (BATCH, SEQ)),
        loss=lambda model, ids: model(input_ids=ids, labels=ids).loss,
        units="auto",
    )


def llama_1M() -> Any:  # noqa: N802 - the size is the name
    return _llama("1M")


def llama_10M() -> Any:  # noqa: N802
    return _llama("10M")


def llama_50M() -> Any:  # noqa: N802
    return _llama("50M")


def llama_185M() -> Any:  # noqa: N802
    return _llama("185M")


def llama_300M() -> Any:  # noqa: N802
    return _llama("300M")


def parallelize_llama(model: Any, mesh: Any) -> Any:
    """The user's function the ``function`` rows check: activation checkpointing and
    ``fully_shard`` per decoder layer in bf16 with a float32 reduce, then the root (torchtitan's
    shape, without compiling: compile time would dominate either side)."""
    import torch
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    layers = model.model.layers
    for index, layer in enumerate(layers):
        layers[index] = fully_shard(checkpoint_wrapper(layer), mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def _function(size: str) -> Any:
    import dataclasses

    import torch
    from torch.distributed.algorithms._checkpoint import checkpoint_wrapper  # noqa: F401 - as above

    return dataclasses.replace(
        _llama(size),
        name=f"llama_fn_{size}",
        units=(),
        parallelize=parallelize_llama,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=True),
    )


def llama_fn_1M() -> Any:  # noqa: N802
    return _function("1M")


def llama_fn_10M() -> Any:  # noqa: N802
    return _function("10M")


def llama_fn_50M() -> Any:  # noqa: N802
    return _function("50M")


def llama_fn_185M() -> Any:  # noqa: N802
    return _function("185M")


def llama_fn_300M() -> Any:  # noqa: N802
    return _function("300M")


def spec(size: str, function: bool = False) -> str:
    """The workload spec of ``size`` (``ci.bench.cost_curve:llama_10M``; ``function``: the one
    parallelized by the user's :func:`parallelize_llama`)."""
    return f"{__name__}:llama_{'fn_' if function else ''}{size}"
