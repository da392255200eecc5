"""Every private torch API the scaler uses, in one place (the harness keeps its own in
``harness/torch_private``: the library never imports the harness).

Each was read from torch 2.11, 2.12, 2.13 and 2.14, where it is the same. ``torch._amp_*`` and
``torch._foreach_*`` are not here: they are ATen operators (the dispatcher's, whose schema is
versioned by torch itself), the very kernels torch's own ``GradScaler`` calls.

Why each is used at all:

* ``_group_tensors_by_device_and_dtype``: the C++ bucketing torch's optimizers use; one call instead
  of a Python loop over every gradient (the scaler's host work dominates at many small tensors).
* ``_set_grad_enabled``: the C-level switch, without the context manager's Python frames, around the
  unscale kernels (gradients may require grad under ``create_graph=True``).
* ``ShardedTensor`` and its metadata (``torch.distributed._shard``): ``ShardedOptimizer`` serves
  parameters sharded that way; there is no public home for the class.
* ``_init_from_local_shards_and_global_metadata``: the only constructor of a ``ShardedTensor`` from
  shards this rank already holds without a collective.
* ``compute_local_shape_and_global_offset``: where a DTensor's local chunk lies in the global
  tensor, the offsets DCP itself uses (stable since torch 2.2).
* ``DTensor._local_tensor``: the local shard itself, not a view through autograd (``to_local()``
  records a node and, for a gradient, would detach the one the optimizer steps).
* ``_resolve_process_group``: a scaler unpickled in a rank finds its group again by name.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._shard.sharded_tensor import Shard as ShardedTensorShard
from torch.distributed._shard.sharded_tensor import (
    ShardedTensor,
    ShardedTensorMetadata,
    TensorProperties,
)

__all__ = [
    "ShardedTensor",
    "ShardedTensorMetadata",
    "ShardedTensorShard",
    "TensorProperties",
    "group_tensors_by_device_and_dtype",
    "local_shape_and_global_offset",
    "local_tensor",
    "resolve_process_group",
    "set_grad_enabled",
    "sharded_tensor_from_local_shards",
    "sharded_tensor_group",
]

group_tensors_by_device_and_dtype = torch._C._group_tensors_by_device_and_dtype
"""``(lists of tensors, with_indices) -> {(device, dtype): (lists, indices)}``."""

set_grad_enabled = torch._C._set_grad_enabled
"""``set_grad_enabled(mode: bool)``: autograd recording on or off for this thread."""


def sharded_tensor_from_local_shards(
    shards: list[Any], metadata: ShardedTensorMetadata, *, process_group: Any
) -> ShardedTensor:
    """A ``ShardedTensor`` from this rank's shards and the global metadata, with no collective."""
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        shards, metadata, process_group=process_group
    )


def sharded_tensor_group(tensor: ShardedTensor) -> Any:
    """The process group a ``ShardedTensor`` is sharded over (``_process_group``)."""
    return tensor._process_group


def local_tensor(tensor: Any) -> torch.Tensor:
    """A DTensor's local shard itself (``_local_tensor``), no autograd node in between."""
    return tensor._local_tensor


def local_shape_and_global_offset(shape: Any, mesh: Any, placements: Any) -> tuple[Any, Any]:
    """The local chunk's shape and its offset in the global tensor, per dimension."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return compute_local_shape_and_global_offset(shape, mesh, placements)


def resolve_process_group(name: str) -> Any:
    """The process group registered under ``name``."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._resolve_process_group(name)
