"""FSDP1 (``FullyShardedDataParallel``) internals the harness reads: a unit's handle and its flat
parameter's layout, and the two reductions the staged check observes.

Read from torch 2.11, 2.12, 2.13 and 2.14 (``torch/distributed/fsdp/_flat_param.py``,
``_runtime_utils.py``): the same in all four. Why the layout at all: FSDP's own full-tensor APIs
give full gradients only with ``use_orig_params=True`` and cost dozens of object collectives a call
(``harness/parity/ranks/sides/full/flat.py`` says it in full), so the harness cuts a unit's flat
shard itself by the flat parameter's metadata.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from harness.torch_private.patches import PatchSite

_READS = (
    (
        "torch.distributed.fsdp._flat_param",
        "FlatParameter._init_metadata",
        ("_fqns", "_shapes", "_numels_with_padding", "_is_padding_mask"),
    ),
)
REDUCE = (
    PatchSite(
        module="torch.distributed.fsdp._runtime_utils",
        name="_reduce_grad",
        parameters=("state", "handle"),
        called_from="_post_backward_hook",
        reads=_READS,
    ),
    PatchSite(
        module="torch.distributed.fsdp._runtime_utils",
        name="_reduce_grad_no_shard",
        parameters=("state", "handle"),
        called_from="_post_backward_hook",
        reads=_READS,
    ),
)
"""A unit's flat gradient (already in the policy's reduce dtype) enters one of these two, sharded
and unsharded strategies."""


def handle_of(module: Any) -> Any:
    """An FSDP1 unit's ``FlatParamHandle``, or ``None`` for a unit without parameters (``_handle``)."""
    return module._handle


def flat_param_of(module: Any) -> Any:
    """The unit's ``FlatParameter``, or ``None`` for a unit without parameters."""
    handle = module._handle
    return None if handle is None else handle.flat_param


def is_sharded(module: Any) -> bool:
    """Whether the unit's strategy shards its flat parameter (not ``NO_SHARD``)."""
    return bool(module._handle.uses_sharded_strategy)


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """How a flat parameter lays its original parameters out, unsharded: each one's name (relative
    to its unit), shape, and the segments of the flat tensor (a parameter or padding)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    numels_with_padding: tuple[int, ...]
    """The length of each segment, parameters and padding in order."""
    is_padding: tuple[bool, ...]
    """Whether each segment is padding (no padding anywhere: all ``False``)."""
    unpadded_numel: int
    """The elements of the unsharded flat parameter before the padding that makes it divide."""


def layout(flat: Any) -> Layout:
    """``flat``'s layout (``_fqns``, ``_shapes``, ``_numels_with_padding``, ``_is_padding_mask``,
    ``_unpadded_unsharded_size``)."""
    segments = tuple(flat._numels_with_padding)
    padding = getattr(flat, "_is_padding_mask", None) or [False] * len(segments)
    return Layout(
        names=tuple(flat._fqns),
        shapes=tuple(tuple(shape) for shape in flat._shapes),
        numels_with_padding=segments,
        is_padding=tuple(bool(p) for p in padding),
        unpadded_numel=int(flat._unpadded_unsharded_size.numel()),
    )


def original_params(flat: Any) -> list[Any] | None:
    """The original parameters the optimizer holds with ``use_orig_params=True`` (``_params``), or
    ``None`` where it holds the flat parameter itself."""
    params = getattr(flat, "_params", None)
    return None if params is None else list(params)


def shard_infos(flat: Any) -> list[Any]:
    """Where each original parameter lies in this rank's shard (``_shard_param_infos``: each with
    ``in_shard``, ``offset_in_shard``, ``numel_in_shard``, ``intra_param_start_idx``)."""
    return list(flat._shard_param_infos)
