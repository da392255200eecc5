"""The reference's reduction where its order is free (rank side): flat all-reduces, no layout.

Why: over a shard group of 2 ranks without replicas every element of a reduced gradient is the sum
of two addends, and ``a + b`` is ``b + a``: whichever collective, buffer layout or chunking sums
it, the bits are the candidate's (``reduce_layout.py`` mirrors the layout only where the order
matters, from 3 ranks on). A small model's step waits on each collective's latency far more than it
copies (gloo over loopback: 0.2 ms and more a call, each bucket a call), so its gradients travel in
one flat buffer. A larger model's go bucket by bucket: the flat copy would hold the model's
gradients twice where a bucket at a time holds one bucket twice. Either way a bucket is a plain
flat buffer whose reduced gradients are views of it, not the candidate's chunked layout: at 55M
parameters laying each FSDP2 bucket out by chunks and copying every gradient back out of it was
5% of a rank's step, for the same bits. A large call goes through memory the two ranks share
where they can (``shared_pair.py``), not gloo's sockets: the same bits again.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
import torch.distributed as dist

from harness.parity.ranks.sides.two_ranks import shared_pair
from harness.torch_private import tensors

ONE_CALL_MB = 16.0
"""The gradients' size up to which they are reduced in one all-reduce."""


def free(groups: tuple[Any, Any]) -> bool:
    """Whether ``groups`` (shard group, replicate group or ``None``) sum each element in any order
    alike: a shard group of 2 ranks without replicas. Any collective over it may then reduce a
    bucket (one all-reduce, not a reduce-scatter and a gather)."""
    shard, replicate = groups
    return replicate is None and dist.get_world_size(shard) == 2


def one_call(grads: list[torch.Tensor | None]) -> bool:
    """Whether ``grads`` are small enough for one flat buffer (:data:`ONE_CALL_MB`)."""
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
    ``reduce_dtype`` and reduced over ``group`` in the all-reduces :func:`calls` says, ``how`` =
    ``(op, divide before, divide after)`` as every bucket of the layout has it; written into
    ``out`` (``consume``: the entries of ``grads`` are the caller's to give up, they become
    ``None`` as they are reduced, and a gradient may be reduced in place). A call of several
    gradients reduces a flat buffer whose views they become; a call of one reduced in place, where
    it (or its cast to ``reduce_dtype``) lies."""
    op, pre, post = how
    for held, in_place in calls(buckets, grads, reduce_dtype, consume):
        cast = [grads[i].to(reduce_dtype) for i in held]  # type: ignore[union-attr]
        flat = cast[0] if in_place else tensors.flatten_dense(cast)
        del cast  # a cast copy (a low-precision gradient) is not held beside the flat one
        if pre is not None and pre != 1:
            flat.div_(pre)
        shared_pair.all_reduce(flat, op, group)  # two ranks on one host: through shared memory
        if post is not None and post != 1:
            flat.div_(post)
        views = [flat] if in_place else tensors.unflatten_dense(flat, [grads[i] for i in held])
        for index, grad in zip(held, views, strict=True):
            out[index] = grad
            if consume:
                grads[index] = None
    return out


def calls(
    buckets: list[Any], grads: list[torch.Tensor | None], reduce_dtype: torch.dtype, consume: bool
) -> list[tuple[list[int], bool]]:
    """The all-reduces of ``buckets``' gradients, each ``(gradients, in place)``: one call of all
    of them where they fit (:data:`ONE_CALL_MB`), else a bucket at a time (a parameter two buckets
    hold, in the first), each gradient of :data:`IN_PLACE_MB` or more that may be overwritten
    (:func:`_alone`) in a call of its own, in place, the rest of the bucket in one call."""
    held = list(dict.fromkeys(i for bucket in buckets for i in bucket.params if grads[i] is not None))
    if one_call([grads[i] for i in held]):
        return [(held, False)] if held else []
    found: list[tuple[list[int], bool]] = []
    seen: set[int] = set()
    for bucket in buckets:
        call = [i for i in dict.fromkeys(bucket.params) if grads[i] is not None and i not in seen]
        seen.update(call)
        alone = _alone(call, grads, reduce_dtype, consume)
        found += [([i], True) for i in call if i in alone]
        if rest := [i for i in call if i not in alone]:
            found.append((rest, False))
    return found


IN_PLACE_MB = 1.0
"""Of a model too large for one call, the size from which a gradient is all-reduced where it lies
(where its cast to the reduce dtype lies): its own call's latency costs less than copying it into
a bucket's buffer, whose pages are fresh at every step (the ranks give freed memory back)."""


def _alone(
    call: list[int], grads: list[torch.Tensor | None], reduce_dtype: torch.dtype, consume: bool
) -> set[int]:
    """Which of ``call``'s gradients go in a call of their own, reduced where they lie: large,
    contiguous, sharing no storage with another gradient of the call, and either the caller's to
    give up (``consume``) or cast into a copy anyway."""
    storages = collections.Counter(grads[i].untyped_storage().data_ptr() for i in call)  # type: ignore[union-attr]
    return {
        i
        for i in call
        if (grad := grads[i]) is not None
        and grad.numel() * grad.element_size() >= IN_PLACE_MB * 2**20
        and grad.is_contiguous()
        and storages[grad.untyped_storage().data_ptr()] == 1
        and (consume or grad.dtype != reduce_dtype)
    }
