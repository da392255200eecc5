"""Named parameters of a ShardedOptimizer, resolved into the plain tensors its local optimizer steps.

Why a separate module: the wrapper needs one answer to "which local tensors stand for parameter
``name``, and where do they sit in the global tensor?" for three kinds of parameters. Keeping the
kind-specific knowledge here leaves ``_optimizer.py`` with the optimizer protocol only.

- plain tensor: itself; it is the whole (replicated) parameter.
- DTensor: its local shard (``_local_tensor``, which shares storage with the DTensor, so in-place
  updates of the local optimizer update the DTensor). Backward puts the gradient on the DTensor,
  not on the local tensor; :meth:`NamedParam.link_grad` makes the local tensor's ``.grad`` *the
  same tensor object* as the DTensor gradient's local shard, so a scaler that unscales
  ``param_groups[*]["params"][*].grad`` in place unscales the DTensor gradient too.
- ShardedTensor: each of its local shards (plain leaf tensors that receive gradients directly).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from scaler._torch_private import ShardedTensor, local_shape_and_global_offset, local_tensor


@dataclass(frozen=True, kw_only=True, slots=True)
class LocalSlot:
    """One plain tensor that the local optimizer steps, and where it sits in its global parameter."""

    tensor: torch.Tensor
    """The local tensor (a plain parameter, a DTensor's local shard, a ShardedTensor local shard)."""
    offsets: tuple[int, ...]
    """Global offset of ``tensor`` in every dimension (all zeros for a replicated parameter)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NamedParam:
    """A user parameter under its name, with the local slots that stand for it on this rank."""

    name: str
    """The parameter's name, the key of its state in ``state_dict()``."""
    param: torch.Tensor
    """The parameter as the user gave it: a plain tensor, a DTensor or a ShardedTensor."""
    slots: tuple[LocalSlot, ...]
    """Local tensors of this parameter on this rank (none for a ShardedTensor without local shards)."""
    global_shape: torch.Size
    """Shape of the whole parameter across all ranks."""

    @property
    def kind(self) -> str:
        """``"dtensor"``, ``"sharded_tensor"`` or ``"tensor"``; used in messages."""
        if isinstance(self.param, DTensor):
            return "dtensor"
        if isinstance(self.param, ShardedTensor):
            return "sharded_tensor"
        return "tensor"

    @property
    def description(self) -> str:
        """The kind in words, for messages: "a DTensor", "a ShardedTensor", "a plain tensor"."""
        return {"dtensor": "a DTensor", "sharded_tensor": "a ShardedTensor"}.get(self.kind, "a plain tensor")

    @property
    def is_distributed(self) -> bool:
        """Whether the parameter's state is saved as a DTensor/ShardedTensor (not as plain tensors)."""
        return self.kind != "tensor"

    def link_grad(self) -> None:
        """Make the local shard's ``.grad`` the DTensor gradient's local shard (no-op for other kinds).

        A gradient whose placements differ from the parameter's (e.g. ``Partial`` for a replicated
        parameter) is redistributed first; that is a collective, which is fine because every rank
        runs the same backward and the same ``step()``.
        """
        if not isinstance(self.param, DTensor):
            return
        (slot,) = self.slots
        grad = self.param.grad
        if grad is None:
            slot.tensor.grad = None
            return
        if not isinstance(grad, DTensor):
            raise TypeError(
                f"parameter {self.name!r} is a DTensor but its .grad is a {type(grad).__name__}; "
                "assign a DTensor gradient with the parameter's placements"
            )
        if tuple(grad.placements) != tuple(self.param.placements):
            grad = grad.redistribute(self.param.device_mesh, self.param.placements)
            self.param.grad = grad
        local_grad = local_tensor(grad)
        if slot.tensor.grad is not local_grad:
            slot.tensor.grad = local_grad

    def clear_grad(self, *, set_to_none: bool) -> None:
        """Clear the DTensor-level gradient as ``zero_grad`` does for the local ones."""
        if not isinstance(self.param, DTensor) or self.param.grad is None:
            return
        if set_to_none:
            self.param.grad = None
        else:
            local_tensor(self.param.grad).zero_()


def _contiguous_offsets(shape: torch.Size) -> tuple[int, ...]:
    return (0,) * len(shape)


def _resolve_one(name: str, param: Any) -> NamedParam:
    if isinstance(param, ShardedTensor):
        slots = tuple(
            LocalSlot(tensor=shard.tensor, offsets=tuple(shard.metadata.shard_offsets))
            for shard in param.local_shards()
        )
        return NamedParam(name=name, param=param, slots=slots, global_shape=torch.Size(param.metadata().size))
    if isinstance(param, DTensor):
        for placement in param.placements:
            if not (isinstance(placement, Replicate) or type(placement) is Shard):
                raise ValueError(
                    f"parameter {name!r} has placement {placement}; ShardedOptimizer supports DTensor "
                    "parameters placed with Shard(dim) and Replicate() only"
                )
        # The offsets DCP itself uses for DTensor chunks (scaler._torch_private).
        local_shape, offsets = local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        local = local_tensor(param)
        assert tuple(local.shape) == tuple(local_shape), (name, local.shape, local_shape)
        return NamedParam(
            name=name,
            param=param,
            slots=(LocalSlot(tensor=local, offsets=tuple(offsets)),),
            global_shape=param.shape,
        )
    if isinstance(param, torch.Tensor):
        if not (param.is_leaf or param.retains_grad):
            raise ValueError(
                f"parameter {name!r} is not a leaf tensor; optimize the leaf it was computed from "
                "(e.g. the nn.Parameter), not a result of an operation"
            )
        return NamedParam(
            name=name,
            param=param,
            slots=(LocalSlot(tensor=param, offsets=_contiguous_offsets(param.shape)),),
            global_shape=param.shape,
        )
    raise TypeError(
        f"parameter {name!r} is a {type(param).__name__}; ShardedOptimizer optimizes torch.Tensor, "
        "DTensor and ShardedTensor parameters"
    )


def resolve_named_params(params: Any, *, where: str) -> list[NamedParam]:
    """Resolve ``{name: param}`` or an iterable of ``(name, param)`` pairs into :class:`NamedParam`.

    ``where`` says which argument is being resolved, for the messages.
    """
    if isinstance(params, torch.Tensor):
        raise TypeError(
            f"{where} must map parameter names to tensors, got a single {type(params).__name__}; "
            "pass {'name': tensor} or model.named_parameters()"
        )
    if isinstance(params, Mapping):
        pairs = list(params.items())
    elif isinstance(params, Iterable) and not isinstance(params, (str, bytes)):
        pairs = list(params)
    else:
        raise TypeError(
            f"{where} must map parameter names to tensors, got {type(params).__name__}; "
            "pass {'name': tensor} or model.named_parameters()"
        )
    resolved: list[NamedParam] = []
    seen: set[str] = set()
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            found = type(pair).__name__
            raise TypeError(
                f"{where} must hold named parameters, but item {index} is a {found}; ShardedOptimizer "
                "keys its state by parameter name: pass {'name': tensor} or model.named_parameters()"
            )
        name, param = pair
        if name in seen:
            raise ValueError(f"parameter name {name!r} appears twice in {where}; names must be unique")
        seen.add(name)
        resolved.append(_resolve_one(name, param))
    if not resolved:
        raise ValueError(f"{where} is empty; give at least one named parameter")
    return resolved
