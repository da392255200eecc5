"""Finding non-finite gradients and unscaling them, bucketed by (device, dtype).

Why a module of its own: both scalers walk the optimizer's gradients the same way; they differ
only in whether fp16 gradients are allowed, how an uncoalesced fp16 sparse gradient is coalesced
(each as its torch counterpart does), and whether DTensor gradients are reduced to their local
shard (ShardedGradScaler does its own single cross-rank agreement, so it must not let DTensor's
dispatcher run one more all-reduce per bucket).

Why it is built the way it is (host overhead): this runs for every parameter on every step, and
with many small tensors the Python work per parameter, not the kernel, is the cost. The common
case - every gradient a plain dense ``torch.Tensor`` - is recognised in bulk (C-level ``map`` over
the gradients) and grouped by torch's own C++ grouping, the one its foreach optimizers use;
everything else (DTensor, sparse, tensor subclasses) takes a per-parameter loop. Buckets are
grouped afresh on every step rather than cached by gradient identity: with
``zero_grad(set_to_none=True)`` (the default) every gradient is a new object each step, and a
gradient that *is* the same object may have changed dtype or device through ``.data``
assignment (``module.half()``, ``module.to()``), so identity proves nothing about the bucket, and
checking dtype and device per gradient costs as much as grouping again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import chain
from operator import attrgetter, itemgetter

import torch

from scaler._torch_private import group_tensors_by_device_and_dtype, set_grad_enabled

try:  # DTensor is optional: torch builds without distributed support lack it.
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - only on builds without torch.distributed
    DTensor = None  # type: ignore[assignment,misc]

__all__ = ["PerDevice", "fresh_flag", "group_grads", "unscale_grads_", "unscale_groups_"]

_GRAD = attrgetter("grad")
_PARAMS = itemgetter("params")
_IS_SPARSE = attrgetter("is_sparse")
_PLAIN = {torch.Tensor}
_NONE = type(None)
_PLAIN_OR_NONE = {torch.Tensor, _NONE}
_group_by_device_and_dtype = group_tensors_by_device_and_dtype

GradGroups = list[tuple[torch.device, Sequence[torch.Tensor]]]
"""``[(device, tensors)]``, one entry per (device, dtype): the argument lists of the unscale kernel."""


class PerDevice:
    """Lazily serves copies of one tensor on each device that asks for it (cached per device)."""

    __slots__ = ("master", "copies")

    def __init__(self, master: torch.Tensor) -> None:
        self.master = master
        self.copies: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device) -> torch.Tensor:
        copy = self.copies.get(device)
        if copy is None:
            copy = self.master.to(device=device, non_blocking=True, copy=True)
            self.copies[device] = copy
        return copy


_ZERO_FLAGS: dict[torch.device, torch.Tensor] = {}


def fresh_flag(device: torch.device) -> torch.Tensor:
    """A new float32 zero on ``device``: a found_inf flag for one optimizer step. ``zeros_like`` of
    a kept template is the cheapest way to make one (no dtype/device arguments to parse)."""
    template = _ZERO_FLAGS.get(device)
    if template is None:
        template = _ZERO_FLAGS[device] = torch.zeros((), dtype=torch.float32, device=device)
    return torch.zeros_like(template)


def _all_grads(optimizer: torch.optim.Optimizer) -> list[torch.Tensor | None]:
    """Every parameter's ``.grad`` (None included), in ``param_groups`` order, without a Python loop."""
    groups = optimizer.param_groups
    try:
        if len(groups) == 1:
            return list(map(_GRAD, groups[0]["params"]))
        return list(map(_GRAD, chain.from_iterable(map(_PARAMS, groups))))
    except AttributeError:
        for param in chain.from_iterable(map(_PARAMS, optimizer.param_groups)):
            if not isinstance(param, torch.Tensor):
                raise TypeError(
                    f"optimizer.param_groups holds a {type(param).__name__}, expected torch.Tensor parameters"
                ) from None
        raise


def _refuse_fp16() -> None:
    raise ValueError("Attempting to unscale FP16 gradients.")


def unscale_grads_(
    optimizer: torch.optim.Optimizer,
    inv_scale: torch.Tensor,
    found_inf: Callable[[torch.device], torch.Tensor],
    *,
    allow_fp16: bool,
    local_dtensor: bool,
    coalesce_fp16: Callable[[torch.Tensor], torch.Tensor],
) -> dict[torch.device, torch.Tensor]:
    """Check and unscale the optimizer's gradients: :func:`group_grads`, then
    :func:`unscale_groups_`; returns ``{device: found_inf}``.

    The plain-tensor fast path of :func:`group_grads` does not look for sparse gradients when all
    gradients share one (device, dtype): the kernel refuses such a list before it touches any
    tensor (one sparse tensor sends the whole call to the sparse backend, where the kernel does
    not exist), and the gradients are then grouped one by one. This saves a pass over every
    gradient on every step of the common, all-dense case.
    """
    groups = group_grads(
        optimizer, allow_fp16=allow_fp16, local_dtensor=local_dtensor, coalesce_fp16=coalesce_fp16
    )
    try:
        return unscale_groups_(groups, inv_scale, found_inf)
    except NotImplementedError:
        if len(groups) != 1 or not any(map(_IS_SPARSE, groups[0][1])):
            raise
    groups = _group_each(
        optimizer, allow_fp16=allow_fp16, local_dtensor=local_dtensor, coalesce_fp16=coalesce_fp16
    )
    return unscale_groups_(groups, inv_scale, found_inf)


def group_grads(
    optimizer: torch.optim.Optimizer,
    *,
    allow_fp16: bool,
    local_dtensor: bool,
    coalesce_fp16: Callable[[torch.Tensor], torch.Tensor],
) -> GradGroups:
    """The optimizer's gradients as the unscale kernel takes them: one list per (device, dtype).

    Sparse gradients contribute their values; an uncoalesced one is checked as it would be once
    coalesced (see :func:`_group_each`). With ``local_dtensor`` a DTensor gradient contributes its
    local shard. ``coalesce_fp16`` coalesces an fp16 sparse gradient (it replaces ``param.grad``).

    One exception, for speed: when every gradient is a plain tensor and all share one
    (device, dtype), a sparse one among them is left in the single group; the kernel refuses it
    and :func:`unscale_grads_` then groups one by one. With several groups sparse gradients are
    looked for first, since one group's kernel could run before another's refused.
    """
    grads = _all_grads(optimizer)
    types = set(map(type, grads))
    if types <= _PLAIN_OR_NONE:
        if _NONE in types:
            grads = [grad for grad in grads if grad is not None]
        if not grads:
            return []
        grouped = _group_by_device_and_dtype([grads], False)
        if len(grouped) == 1 or not any(map(_IS_SPARSE, grads)):
            groups: GradGroups = []
            for (device, dtype), (lists, _) in grouped.items():
                if dtype is torch.float16 and not allow_fp16:
                    _refuse_fp16()
                groups.append((device, lists[0]))
            return groups
    return _group_each(
        optimizer, allow_fp16=allow_fp16, local_dtensor=local_dtensor, coalesce_fp16=coalesce_fp16
    )


def _group_each(
    optimizer: torch.optim.Optimizer,
    *,
    allow_fp16: bool,
    local_dtensor: bool,
    coalesce_fp16: Callable[[torch.Tensor], torch.Tensor],
) -> GradGroups:
    """The per-parameter path, for DTensor, sparse and other non-plain gradients.

    An uncoalesced sparse gradient with duplicate indices can hold values that are each finite but
    whose sum (what the optimizer applies) is not, in the gradient's own dtype. fp16 gradients are
    replaced by their coalesced form (as torch does). For every other dtype the gradient stays as
    it is - the optimizer sees exactly the values it would see without the check - and a coalesced
    copy of it joins its bucket so that the kernel checks the sums too; the copy is discarded. A
    gradient that is already coalesced costs nothing extra.
    """
    buckets: defaultdict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
    for group in optimizer.param_groups:
        for param in group["params"]:
            try:
                grad = param.grad
            except AttributeError:
                raise TypeError(
                    f"optimizer.param_groups holds a {type(param).__name__}, expected torch.Tensor parameters"
                ) from None
            if grad is None:
                continue
            if not allow_fp16 and grad.dtype == torch.float16:
                _refuse_fp16()
            if type(grad) is not torch.Tensor and local_dtensor and DTensor is not None:
                if isinstance(grad, DTensor):
                    grad = grad.to_local()
            if grad.is_sparse:
                if not grad.is_coalesced():
                    if grad.dtype == torch.float16:
                        param.grad = grad = coalesce_fp16(grad)
                    else:
                        summed = grad.coalesce()._values()
                        buckets[summed.device, summed.dtype].append(summed)
                grad = grad._values()
            buckets[grad.device, grad.dtype].append(grad)
    return [(device, grads) for (device, _), grads in buckets.items()]


def unscale_groups_(
    groups: GradGroups,
    inv_scale: torch.Tensor,
    found_inf: Callable[[torch.device], torch.Tensor],
) -> dict[torch.device, torch.Tensor]:
    """Run the native check-and-unscale kernel once per group; returns ``{device: found_inf}``.

    ``found_inf(device)`` gives the flag tensor for a device (called once per device); each flag
    ends 1.0 if a tensor on that device held an inf/NaN before the multiply, else it keeps its
    value. ``inv_scale`` is copied for each group on another device (in practice: none).
    """
    flags: dict[torch.device, torch.Tensor] = {}
    previous = torch.is_grad_enabled()  # grads may require grad (create_graph=True): no autograd record
    set_grad_enabled(False)
    try:
        for device, grads in groups:
            flag = flags.get(device)
            if flag is None:
                flag = flags[device] = found_inf(device)
            inv = inv_scale if inv_scale.device == device else inv_scale.to(device=device, non_blocking=True)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, flag, inv)
    finally:
        set_grad_enabled(previous)
    return flags
