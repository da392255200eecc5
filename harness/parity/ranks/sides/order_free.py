"""The reference's reduction where its order is free (rank side): every bucket in one all-reduce.

Why: over a shard group of 2 ranks without replicas every element of a reduced gradient is the sum
of two addends, and ``a + b`` is ``b + a``: whichever collective, buffer layout or chunking sums
it, the bits are the candidate's (``reduce_layout.py`` mirrors the layout only where the order
matters, from 3 ranks on). A small model's step waits on each collective's latency far more than it
copies (gloo over loopback: 0.2 ms and more a call, each bucket a call), so its gradients travel in
one flat buffer. A larger model's go bucket by bucket: the flat copy would hold the model's
gradients twice where a bucket at a time holds one bucket twice.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

ONE_CALL_MB = 16.0
"""The gradients' size up to which they are reduced in one all-reduce."""


def free(groups: tuple[Any, Any]) -> bool:
    """Whether ``groups`` (shard group, replicate group or ``None``) sum each element in any order
    alike: a shard group of 2 ranks without replicas. Any collective over it may then reduce a
    bucket (one all-reduce, not a reduce-scatter and a gather)."""
    shard, replicate = groups
    return replicate is None and dist.get_world_size(shard) == 2


def fits(groups: tuple[Any, Any], grads: list[torch.Tensor | None]) -> bool:
    """Whether ``groups`` reduce in a free order (:func:`free`) and ``grads`` are small enough for
    one flat buffer (:data:`ONE_CALL_MB`)."""
    if not free(groups):
        return False
    return sum(g.numel() * g.element_size() for g in grads if g is not None) <= ONE_CALL_MB * 2**20


def reduce(
    buckets: list[Any],
    grads: list[torch.Tensor | None],
    reduce_dtype: torch.dtype,
    how: tuple[Any, float | None, float | None],
    group: Any,
    out: list[torch.Tensor | None],
    consume: bool,
) -> list[torch.Tensor | None]:
    """Every gradient a bucket of ``buckets`` (``reduce_layout.Bucket``) reduces, cast to
    ``reduce_dtype`` and reduced in one all-reduce over ``group``, ``how`` = ``(op, divide before,
    divide after)`` as every bucket of the layout has it; written into ``out`` (``consume``: the
    entries of ``grads`` become ``None``)."""
    held = list(dict.fromkeys(i for bucket in buckets for i in bucket.params if grads[i] is not None))
    if not held:
        return out
    op, pre, post = how
    cast = [grads[i].to(reduce_dtype) for i in held]  # type: ignore[union-attr]
    flat = torch._utils._flatten_dense_tensors(cast)
    if pre is not None and pre != 1:
        flat.div_(pre)
    dist.all_reduce(flat, op=op, group=group)
    if post is not None and post != 1:
        flat.div_(post)
    for index, grad in zip(held, torch._utils._unflatten_dense_tensors(flat, cast), strict=True):
        out[index] = grad
        if consume:
            grads[index] = None
    return out
