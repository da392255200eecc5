"""A candidate's local gradients as they enter its reduction (rank side): the staged check's first stage.

Why here: a sharded engine never exposes its unreduced gradients; the first thing it does with
them is reduce them. The staged check (``ranks/staged.py``) needs them to tell a compute mismatch
(a module that runs otherwise when wrapped: the local gradients differ) from a reduction that sums
in another order (they match, the reduced ones differ within the order-free bound). So for one
backward this wraps the function FSDP hands them to, records a copy of each parameter's
gradient by its name in the user's model, and calls the original, which reduces as usual:

* **FSDP2**: ``foreach_reduce(fsdp_params, unsharded_grads, ...)`` of ``_fsdp_param_group`` (every
  reduce-scatter of a ``fully_shard`` group goes through it, whatever its collective, a custom
  ``set_custom_reduce_scatter`` included); each gradient in the compute dtype, by
  ``FSDPParam._param_fqn``.
* **FSDP1**: ``_reduce_grad`` / ``_reduce_grad_no_shard`` of ``_runtime_utils``: the unit's flat
  gradient (already cast to the policy's reduce dtype), split by the flat parameter's own
  metadata (``_fqns``, ``_shapes``, ``_numels_with_padding``, ``_is_padding_mask``) and prefixed
  with the unit's name.

Read from torch 2.13's sources; only names and layout are read here, never a value FSDP derives
(a divide factor, a dtype choice). DDP's reducer runs in C++ and is not observed (``None``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from harness.parity.ranks.sides import engines, gather


@contextlib.contextmanager
def local_grads(engine: engines.Engine) -> Iterator[dict[str, list[torch.Tensor]] | None]:
    """Inside the block, each gradient ``engine`` reduces is copied into the yielded dict (by name
    as in the user's model; one entry per reduction, in order: an accumulation that reduces every
    microbatch reduces each parameter once per microbatch); ``None`` for an engine whose reduction
    cannot be observed."""
    if isinstance(engine, engines.FSDP2):
        with _fsdp2(engine) as found:
            yield found
    elif isinstance(engine, engines.FSDP1):
        with _fsdp1(engine) as found:
            yield found
    else:
        yield None


@contextlib.contextmanager
def _fsdp2(engine: engines.Engine) -> Iterator[dict[str, list[torch.Tensor]]]:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    found: dict[str, list[torch.Tensor]] = {}
    original = _fsdp_param_group.foreach_reduce

    def recording(
        fsdp_params: list[Any], unsharded_grads: list[torch.Tensor], *args: Any, **kwargs: Any
    ) -> Any:
        for fsdp_param, grad in zip(fsdp_params, unsharded_grads, strict=True):
            found.setdefault(gather.clean_name(fsdp_param._param_fqn), []).append(grad.detach().clone())
        return original(fsdp_params, unsharded_grads, *args, **kwargs)

    _fsdp_param_group.foreach_reduce = recording  # type: ignore[assignment]
    try:
        yield found
    finally:
        _fsdp_param_group.foreach_reduce = original  # type: ignore[assignment]


def _split_flat(flat: torch.Tensor, flat_param: Any, prefix: str) -> dict[str, torch.Tensor]:
    """A unit's flat gradient as its parameters' gradients (padding between them dropped)."""
    out: dict[str, torch.Tensor] = {}
    names = iter(zip(flat_param._fqns, flat_param._shapes, strict=True))
    offset = 0
    for numel, padding in zip(flat_param._numels_with_padding, flat_param._is_padding_mask, strict=True):
        if not padding:
            name, shape = next(names)
            out[gather.clean_name(prefix + name)] = flat[offset : offset + numel].view(shape).clone()
        offset += numel
    return out


@contextlib.contextmanager
def _fsdp1(engine: engines.Engine) -> Iterator[dict[str, list[torch.Tensor]]]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import _runtime_utils

    prefixes = {
        id(module): (gather.clean_name(name) + "." if name else "")
        for name, module in engine.wrapped.named_modules()
        if isinstance(module, FSDP)
    }
    found: dict[str, list[torch.Tensor]] = {}
    originals = {name: getattr(_runtime_utils, name) for name in ("_reduce_grad", "_reduce_grad_no_shard")}

    def recording(name: str) -> Any:
        def record(state: Any, handle: Any) -> Any:
            flat = handle.flat_param.grad.detach()
            for param, grad in _split_flat(flat, handle.flat_param, prefixes.get(id(state), "")).items():
                found.setdefault(param, []).append(grad)
            return originals[name](state, handle)

        return record

    for name in originals:
        setattr(_runtime_utils, name, recording(name))
    try:
        yield found
    finally:
        for name, original in originals.items():
            setattr(_runtime_utils, name, original)
