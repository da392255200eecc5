"""Per-parameter optimizer state: local slots <-> the name-keyed, self-describing saved form.

Why this form: a checkpoint must say, for every state tensor of a sharded parameter, which part of
the global tensor it holds, or it cannot be loaded at another world size. torch already has two
tensor types that carry exactly that and that ``torch.distributed.checkpoint`` (DCP) reshards:
so state shaped like a DTensor parameter's local shard is saved as a DTensor with the parameter's
mesh and placements, and state of a ShardedTensor parameter as a ShardedTensor with the
parameter's shard metadata (dtype taken from the state). Scalars (Adam's ``step``) and the state of
plain parameters are replicated and saved as they are.

Loading accepts, per state tensor: the same DTensor/ShardedTensor form (same world size; a DTensor
on the same mesh with other placements is redistributed), or a plain tensor with the parameter's
*global* shape (a "full" state), from which each rank slices its own shards.

Supported optimizers are the elementwise ones (SGD, Adam, AdamW, Adagrad, RMSprop, ...): every
per-parameter state tensor is a scalar or has the parameter's shape. Factored state (Adafactor)
cannot be sharded along with the parameter and is refused with a message.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from scaler._optim_params import LocalSlot, NamedParam
from scaler._torch_private import (
    ShardedTensor,
    ShardedTensorMetadata,
    ShardedTensorShard,
    TensorProperties,
    local_tensor,
    sharded_tensor_from_local_shards,
    sharded_tensor_group,
)

_RESHARD_HINT = (
    "to load at another world size or sharding, load the checkpoint with torch.distributed.checkpoint"
)


def _shape(shape: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


def _is_shard_shaped(value: Any, slot: LocalSlot) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == slot.tensor.shape


def _wrap_dtensor(named: NamedParam, local: torch.Tensor) -> DTensor:
    param = named.param
    assert isinstance(param, DTensor)
    return DTensor.from_local(
        local,
        param.device_mesh,
        param.placements,
        run_check=False,
        shape=param.shape,
        stride=param.stride(),
    )


def _wrap_sharded_tensor(named: NamedParam, locals_: list[torch.Tensor]) -> ShardedTensor:
    param = named.param
    assert isinstance(param, ShardedTensor)
    metadata = param.metadata()
    properties = TensorProperties(
        dtype=locals_[0].dtype,
        layout=torch.strided,
        requires_grad=False,
        memory_format=torch.contiguous_format,
        pin_memory=False,
    )
    shards = [
        ShardedTensorShard(tensor=local, metadata=shard.metadata)
        for local, shard in zip(locals_, param.local_shards(), strict=True)
    ]
    return sharded_tensor_from_local_shards(
        shards,
        ShardedTensorMetadata(
            shards_metadata=metadata.shards_metadata,
            size=metadata.size,
            tensor_properties=properties,
        ),
        process_group=sharded_tensor_group(param),
    )


def pack_param_state(named: NamedParam, slot_states: list[dict[str, Any]]) -> dict[str, Any]:
    """The saved state of one parameter from the local optimizer's state of each of its slots."""
    assert slot_states and len(slot_states) == len(named.slots)
    packed: dict[str, Any] = {}
    for key, first in slot_states[0].items():
        values = [state[key] for state in slot_states]
        if not named.is_distributed:
            packed[key] = first
        elif all(_is_shard_shaped(v, slot) for v, slot in zip(values, named.slots, strict=True)):
            if named.kind == "dtensor":
                packed[key] = _wrap_dtensor(named, first)
            else:
                packed[key] = _wrap_sharded_tensor(named, values)
        elif isinstance(first, torch.Tensor) and first.dim() > 0:
            raise TypeError(
                f"parameter {named.name!r} ({named.description}): optimizer state {key!r} has shape "
                f"{_shape(first.shape)}, neither a scalar nor the local shard's shape "
                f"{_shape(named.slots[0].tensor.shape)}; ShardedOptimizer can shard only elementwise "
                "optimizer state (SGD, Adam, AdamW, Adagrad, RMSprop, ...)"
            )
        else:
            packed[key] = first  # a scalar: the same on every shard and every rank
    return packed


def _check_global_shape(named: NamedParam, key: str, shape: Any) -> None:
    if _shape(shape) != _shape(named.global_shape):
        raise ValueError(
            f"parameter {named.name!r}: saved optimizer state {key!r} has shape {_shape(shape)}, but "
            f"the parameter has shape {_shape(named.global_shape)}; the checkpoint belongs to another model"
        )


def _slice(full: torch.Tensor, slot: LocalSlot) -> torch.Tensor:
    piece = full
    for dim, (offset, size) in enumerate(zip(slot.offsets, slot.tensor.shape, strict=True)):
        piece = piece.narrow(dim, offset, size)
    return piece


def _dtensor_locals(named: NamedParam, key: str, value: DTensor) -> list[torch.Tensor]:
    _check_global_shape(named, key, value.shape)
    param = named.param
    if not isinstance(param, DTensor) or value.device_mesh != param.device_mesh:
        where = "a DTensor on another device mesh" if isinstance(param, DTensor) else named.description
        raise ValueError(
            f"parameter {named.name!r}: saved optimizer state {key!r} is a DTensor, which loads directly "
            f"only into a DTensor parameter on the same device mesh, not into {where}; {_RESHARD_HINT}"
        )
    if tuple(value.placements) != tuple(param.placements):
        value = value.redistribute(param.device_mesh, param.placements)
    return [local_tensor(value)]


def _sharded_tensor_locals(named: NamedParam, key: str, value: ShardedTensor) -> list[torch.Tensor]:
    _check_global_shape(named, key, value.metadata().size)
    saved = {tuple(shard.metadata.shard_offsets): shard.tensor for shard in value.local_shards()}
    locals_: list[torch.Tensor] = []
    for slot in named.slots:
        local = saved.get(slot.offsets)
        if local is None or local.shape != slot.tensor.shape:
            raise ValueError(
                f"parameter {named.name!r}: saved optimizer state {key!r} has no local shard at offsets "
                f"{list(slot.offsets)} with shape {_shape(slot.tensor.shape)} on this rank (it holds "
                f"{sorted(list(o) for o in saved)}); {_RESHARD_HINT}"
            )
        locals_.append(local)
    return locals_


def unpack_param_state(named: NamedParam, saved: Any) -> list[dict[str, Any]]:
    """Each slot's local optimizer state from one parameter's saved state (tensors are copies)."""
    if not isinstance(saved, dict):
        raise TypeError(
            f"parameter {named.name!r}: saved optimizer state must be a dict of state values, "
            f"got {type(saved).__name__}"
        )
    slot_states: list[dict[str, Any]] = [{} for _ in named.slots]
    for key, value in saved.items():
        if isinstance(value, DTensor):
            locals_ = _dtensor_locals(named, key, value)
        elif isinstance(value, ShardedTensor):
            if named.kind != "sharded_tensor":
                raise ValueError(
                    f"parameter {named.name!r}: saved optimizer state {key!r} is a ShardedTensor, which "
                    f"loads directly only into a ShardedTensor parameter, not into {named.description}; "
                    f"{_RESHARD_HINT}"
                )
            locals_ = _sharded_tensor_locals(named, key, value)
        elif isinstance(value, torch.Tensor) and value.dim() > 0:
            _check_global_shape(named, key, value.shape)
            locals_ = [_slice(value, slot) for slot in named.slots]
        else:
            for state in slot_states:
                state[key] = value.clone() if isinstance(value, torch.Tensor) else value
            continue
        for state, local in zip(slot_states, locals_, strict=True):
            state[key] = local.detach().clone(memory_format=torch.contiguous_format)
    return slot_states
