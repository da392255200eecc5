"""Tensor helpers torch keeps private: flattening many tensors into one buffer and back, the way
DDP and FSDP1 do, and FSDP2's chunked concatenation.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/_utils.py``; ``torch._chunk_cat`` is an ATen
operator): the same. Why torch's and not a ``cat`` of our own: the reference must lay its buffers
out exactly as the candidate's engine does, and these are what the engines call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def flatten_dense(tensors: Sequence[Any]) -> Any:
    """``tensors`` as one contiguous 1-D buffer (``torch._utils._flatten_dense_tensors``)."""
    import torch._utils

    return torch._utils._flatten_dense_tensors(tensors)


def unflatten_dense(flat: Any, like: Sequence[Any]) -> tuple[Any, ...]:
    """Views of ``flat`` shaped as ``like`` (``torch._utils._unflatten_dense_tensors``)."""
    import torch._utils

    return tuple(torch._utils._unflatten_dense_tensors(flat, like))


def chunk_cat(tensors: Sequence[Any], *, dim: int, num_chunks: int) -> Any:
    """Row ``r`` holds chunk ``r`` of every tensor in turn (``torch._chunk_cat``: FSDP2's
    reduce-scatter input)."""
    import torch

    return torch._chunk_cat(tensors, dim=dim, num_chunks=num_chunks)


def apply_to_tensors(fn: Any, value: Any) -> Any:
    """``value`` with ``fn`` applied to each tensor, walked as FSDP1 and FSDP2 walk a module's
    forward arguments to cast them (``torch.distributed.utils._apply_to_tensors``: dicts, lists,
    tuples, named tuples, dataclasses, ``PackedSequence``)."""
    from torch.distributed.utils import _apply_to_tensors

    return _apply_to_tensors(fn, value)
