"""This rank's own elements of the candidate's tensors, where they live (rank side; no copies).

Why: comparing where the data lives costs what training costs. A sharded candidate's parameter,
gradient or optimizer-state tensor is held by the ranks in pieces, and each piece is one
contiguous run of the full tensor's flattened elements: FSDP2 shards dim 0 (``Shard(0)``: rows
``[r * chunk, (r + 1) * chunk)``), FSDP1 cuts each unit's flat parameter into equal shards that
cover ``param.flatten()[intra_param_start_idx : intra_param_end_idx + 1]`` of each parameter
(``_shard_param_infos``). So each rank compares its :class:`Piece` with the same run of its own
reference's full tensor (the reference is replicated: every rank holds all of it), and only
distances travel.

Which rank compares what: each element is compared once. FSDP2 and FSDP1's sharded strategies
give each element to one rank of a shard group; a replicated candidate (DDP, FSDP1 ``NO_SHARD``)
and the replicas of ``HYBRID_SHARD`` are compared by the shard group holding global rank 0, the
same elements a gather onto rank 0 would have seen. A rank that owns nothing of a tensor still
states its global shape and dtype (``values=None``), so that names, shapes and dtypes are checked
from any rank's view.

No collective of its own where it can be helped: a gradient or FSDP2 optimizer state that this
rank lacks is zeros here (as in the full gathers), and the caller agrees which exist on any rank in
the all-reduce its comparison's flags take anyway (``stepcheck.Check``). FSDP1's state agrees here
(``_max_everywhere``: its scalar keys' values travel with it).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import Replicate, Shard

from harness.parity.ranks.sides import engines
from harness.parity.ranks.sides.full import flat, gather
from harness.rank import context
from harness.torch_private import fsdp1

_Pieces = dict[str, "Piece"]


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    """One rank's contiguous run of a full tensor's flattened elements."""

    shape: tuple[int, ...]
    """The full tensor's shape."""
    dtype: torch.dtype
    start: int
    """The flat index of ``values[0]`` in the full tensor."""
    values: torch.Tensor | None
    """This rank's elements, 1-D (``None``: another rank compares them)."""

    @property
    def numel(self) -> int:
        return 0 if self.values is None else self.values.numel()


def _whole(value: Any, owner: bool) -> Piece:
    """A tensor every rank of its group holds whole, compared by ``owner`` alone: read where it is
    (not copied on the CPU; a sparse one made dense, a GPU one brought to the CPU), and only its
    shape and dtype named elsewhere (a copy on every rank cost each a model's worth a step)."""
    tensor = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value)
    if not owner:
        return Piece(tuple(tensor.shape), tensor.dtype, 0, None)
    tensor = gather.whole(tensor)
    return Piece(tuple(tensor.shape), tensor.dtype, 0, tensor.reshape(-1))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


# -- grads ---------------------------------------------------------------------------------------
def grads(engine: engines.Engine, scale: float | None) -> tuple[_Pieces, dict[str, bool]]:
    """This rank's pieces of every gradient a rank may hold (``scale``: still scaled, divided by
    it as :func:`divided` divides), and whether this rank holds each. Views where nothing is
    divided: read before the optimizer step, never kept (a copy of every gradient each step cost
    a model's gradients in time and memory). One this rank lacks is zeros here, as in the full
    gathers: the caller agrees which exist on any rank in the all-reduce its comparison's flags
    take anyway (``stepcheck.Check.grads``), one collective, not two."""
    if isinstance(engine, engines.FSDP2):
        found, held = _fsdp2_grads(engine)
    elif isinstance(engine, engines.FSDP1):
        found, held = _fsdp1_grads(engine)
    else:
        owner = _rank() == 0
        trainable = engine.named_trainable()
        found = {name: _whole(_or_zeros(p.grad, p), owner) for name, p in trainable}
        held = {name: p.grad is not None for name, p in trainable}
    if scale is None or scale == 1:
        return found, held
    return {
        name: piece
        if piece.values is None
        else dataclasses.replace(piece, values=divided(piece.values, scale))
        for name, piece in found.items()
    }, held


def divided(grad: torch.Tensor, scale: float) -> torch.Tensor:
    """``grad / scale`` rounded once to ``grad``'s dtype, a new tensor. Divided by a power of two, a
    float32 or float64 gradient is rounded once by IEEE division itself, and a 16-bit one, divided
    in float32, lands on its own grid exactly (every bfloat16 and float16 value checked, by the
    tests): no float64 copy of a model's gradients. Another scale's quotient is inexact: float64,
    once."""
    if math.frexp(scale)[0] == 0.5:
        return grad / scale
    return (grad.double() / scale).to(grad.dtype)


def _or_zeros(grad: torch.Tensor | None, param: torch.Tensor) -> torch.Tensor:
    return grad if grad is not None else torch.zeros_like(param)


_Own = tuple[bool, bool] | None
"""A pipeline rank's say over its stage's tensors: ``(compares its shards, compares tensors its
stage holds whole)``; ``None`` elsewhere (rank 0's group compares)."""


def _dtensor_piece(value: Any, param: Any, own: _Own = None) -> Piece:
    """The local shard of a DTensor laid out like ``param`` (zeros when ``value`` is ``None``:
    this rank lacks what another holds). ``Shard(0)`` over the mesh's last dimension (FSDP2, or
    HSDP's ``(Replicate(), Shard(0))``) is compared where it lives, by the shard group that holds
    global rank 0 (on a sub-mesh, as FSDP over TP's ``dp``, the other groups hold the same
    elements). Any other placement (a TP'd parameter's ``(_StridedShard, Shard)``) is gathered
    whole (collective over its mesh: every rank asks for the same tensors in the same order) and
    compared by rank 0. ``own``: a pipeline stage's, whose ranks are the only ones holding it
    (:func:`_stage_owner`)."""
    mesh, placements = param.device_mesh, tuple(param.placements)
    if placements not in _along_last(mesh.ndim):
        whole = gather.zeros_like_shards(param) if value is None else value
        return _whole(whole.full_tensor(), own[1] if own is not None else _rank() == 0)
    local = param.to_local() if value is None else value.to_local()
    if value is None:
        local = torch.zeros_like(local)
    shape = tuple(param.shape)
    row = 1
    for size in shape[1:]:
        row *= size
    mesh_rank, mesh_size, zero_group = _last_dim(mesh)
    chunk = -(-shape[0] // mesh_size) if shape else 0
    start = min(mesh_rank * chunk, shape[0] if shape else 0) * row
    dtype = param.dtype if value is None else value.dtype
    owner = own[0] if own is not None else zero_group
    return Piece(shape, dtype, start, local.detach().reshape(-1) if owner else None)


def _along_last(ndim: int) -> tuple[tuple[Any, ...], ...]:
    """The placements that shard dim 0 over a mesh's last dimension: FSDP2's ``(Shard(0),)``, and
    HSDP's ``(Replicate(), Shard(0))`` on a 2-D mesh."""
    return _ALONG_LAST_2D if ndim == 2 else _ALONG_LAST_1D


_ALONG_LAST_1D = ((Shard(0),),)
_ALONG_LAST_2D = ((Shard(0),), (Replicate(), Shard(0)))

_MESH_FACTS = context.GroupKey[dict[int, tuple[weakref.ref[Any], tuple[int, int, bool]]]]()
"""In the default group's stash, by ``id(mesh)``: the mesh (weakly, to tell a new mesh at a reused
address) and its :func:`_last_dim` facts; a re-created group starts with none."""


def _last_dim(mesh: Any) -> tuple[int, int, bool]:
    """``(this rank's coordinate, size, whether its group holds global rank 0)`` along ``mesh``'s
    last dimension; asked once per mesh (a step asks per tensor, and the mesh answers each in
    Python at some cost), and again for a new mesh."""
    known_meshes = context.group_stash().setdefault(_MESH_FACTS, dict)
    known = known_meshes.get(id(mesh))
    if known is not None and known[0]() is mesh:
        return known[1]
    dim = mesh.ndim - 1
    facts = (mesh.get_local_rank(dim), mesh.size(dim), _rank_zero_group(mesh, dim))
    known_meshes[id(mesh)] = (weakref.ref(mesh), facts)
    return facts


def _holds_rank_zero(mesh: Any, dim: int) -> bool:
    """Whether this rank's group along ``dim`` of ``mesh`` holds global rank 0 (no collective)."""
    return 0 in dist.get_process_group_ranks(mesh.get_group(dim))


def _rank_zero_group(mesh: Any, dim: int) -> bool:
    return (mesh.ndim == 1 and mesh.size() == dist.get_world_size()) or _holds_rank_zero(mesh, dim)


def _fsdp2_piece(value: Any, param: Any, own: _Own = None) -> Piece:
    if hasattr(param, "device_mesh"):
        return _dtensor_piece(value, param, own)
    whole = value if value is not None else torch.zeros_like(param)
    return _whole(whole, own[1] if own is not None else _rank() == 0)


def _stage_owner(engine: engines.Engine) -> _Own:
    """A pipeline rank's say (``engine.stage_owner``: its stage's shards where its TP coordinate is
    0, whole tensors on the stage's first rank); ``None`` for any other engine."""
    return engine.stage_owner if engine.compares_own_shards else None  # type: ignore[attr-defined]


def _whole_owner(engine: engines.Engine) -> bool:
    """Who compares a tensor every rank of its group holds whole: rank 0, or (a pipeline's
    stages) each stage's first rank."""
    own = _stage_owner(engine)
    return own[1] if own is not None else _rank() == 0


def _complete(
    engine: Any, pieces: _Pieces, held: dict[str, bool], keys: tuple[tuple[str, ...], ...] | None = None
) -> None:
    """Name in ``pieces`` every parameter of a pipeline's whole model (``engine.whole_meta``) and,
    with ``keys`` (element, scalar), its optimizer state's entries: one this rank's stages do not
    hold as a piece the stage holding it compares, not held here. Every rank then names the same
    tensors, as the agreeing all-reduce needs (``compared.agreed``)."""
    for name, (shape, dtype) in engine.whole_meta.items():
        if keys is None:
            entries = {name: (shape, dtype)}
        else:
            element, scalar = keys
            entries = {f"{name}:{key}": (shape, dtype) for key in element}
            entries.update({f"{name}:{key}": ((), torch.float32) for key in scalar})
        for entry, (entry_shape, entry_dtype) in entries.items():
            if entry not in pieces:
                pieces[entry] = Piece(entry_shape, entry_dtype, 0, None)
                held[entry] = False


def _fsdp2_grads(engine: engines.FSDP2) -> tuple[_Pieces, dict[str, bool]]:
    trainable = engine.named_trainable()
    own = _stage_owner(engine)
    found = {name: _fsdp2_piece(p.grad, p, own) for name, p in trainable}
    held = {name: p.grad is not None for name, p in trainable}
    if own is not None:  # a pipeline rank names the stages it does not hold too
        _complete(engine, found, held)
    return found, held


def _fsdp1_owner(unit: Any) -> bool:
    """Whether this rank compares ``unit``'s elements (see the module docstring)."""
    if not fsdp1.is_sharded(unit.module):
        return _rank() == 0
    return 0 in dist.get_process_group_ranks(unit.module.process_group)


def _fsdp1_cut(unit: Any, local: torch.Tensor | None, dtype: torch.dtype, owner: bool) -> _Pieces:
    """``local`` (laid out like the unit's local flat shard) cut into each parameter's piece."""
    out = {}
    infos = fsdp1.shard_infos(unit.flat)
    for name, shape, info in zip(unit.names, unit.layout.shapes, infos, strict=True):
        values = None
        start = 0
        if owner and info.in_shard and local is not None:
            values = local.detach().reshape(-1)[
                info.offset_in_shard : info.offset_in_shard + info.numel_in_shard
            ]
            start = info.intra_param_start_idx
        out[name] = Piece(tuple(shape), dtype, start, values)
    return out


def _fsdp1_grads(engine: engines.FSDP1) -> tuple[_Pieces, dict[str, bool]]:
    found: _Pieces = {}
    held: dict[str, bool] = {}
    for unit in flat.units(engine.wrapped):
        grad = unit.flat.grad if unit.flat.grad is not None else torch.zeros_like(unit.flat)
        cut = _fsdp1_cut(unit, grad, grad.dtype, _fsdp1_owner(unit))
        found.update(cut)
        held.update(dict.fromkeys(cut, unit.flat.grad is not None))
    return found, held


# -- parameters and optimizer state -------------------------------------------------------------
def params_and_state(
    engine: engines.Engine, optimizers: list[torch.optim.Optimizer]
) -> tuple[_Pieces, _Pieces, dict[str, bool] | None]:
    """``(parameters by name, optimizer state by "name:key", held)``: views, valid until the next
    step. ``held``: FSDP2's state of every trainable parameter, zeros where this rank holds none,
    and whether it does, for the caller to agree with its comparison's flags (one all-reduce);
    ``None`` where the state is already the state some rank holds (FSDP1 agrees on it here,
    with the scalar keys' values; a replicated engine holds all of it)."""
    if isinstance(engine, engines.FSDP2):
        return _fsdp2_params_and_state(engine, optimizers)
    if isinstance(engine, engines.FSDP1):
        return (*_fsdp1_params_and_state(engine, optimizers), None)
    owner = _rank() == 0
    params, state = engine.full_after_step(optimizers)
    pieces = {name: _whole(value, owner) for name, value in params.items()}
    states = {
        f"{name}:{key}": _whole(value, owner)
        for name, values in state.items()
        for key, value in values.items()
    }
    return pieces, states, None


def _fsdp2_params_and_state(
    engine: engines.FSDP2, optimizers: list[torch.optim.Optimizer]
) -> tuple[_Pieces, _Pieces, dict[str, bool]]:
    element_keys, scalar_keys = gather.state_keys(optimizers)
    state = {id(p): values for opt in optimizers for p, values in opt.state.items()}
    own = _stage_owner(engine)
    params = {name: _fsdp2_piece(p, p, own) for name, p in engine.named_parameters_whole()}
    states: _Pieces = {}
    held: dict[str, bool] = {}
    for name, param in engine.named_trainable():
        values = state.get(id(param), {})
        for key in element_keys:
            states[f"{name}:{key}"] = _fsdp2_piece(values.get(key), param, own)
        for key in scalar_keys:
            states[f"{name}:{key}"] = _whole(values.get(key, torch.zeros(())), _whole_owner(engine))
        held.update(dict.fromkeys((f"{name}:{key}" for key in (*element_keys, *scalar_keys)), bool(values)))
    if own is not None:  # a pipeline rank names the stages it does not hold too
        _complete(engine, params, {})
        _complete(engine, states, held, (element_keys, scalar_keys))
    return params, states, held


def _fsdp1_params_and_state(
    engine: engines.FSDP1, optimizers: list[torch.optim.Optimizer]
) -> tuple[_Pieces, _Pieces]:
    """FSDP1 keeps optimizer state on the flat parameter (laid out like its local shard) or, with
    ``use_orig_params=True``, on each original parameter (its ``numel_in_shard`` elements). A
    scalar key (Adam's ``step``) is the largest value any rank holds for the parameter, in
    float32, as the full gather reports it (one all-reduce for every unit's names)."""
    state = {id(p): values for opt in optimizers for p, values in opt.state.items()}
    element_keys, scalar_keys = gather.state_keys(optimizers)
    units = flat.units(engine.wrapped)
    params: _Pieces = {}
    states: _Pieces = {}
    names: list[str] = []
    local_rows: list[list[float]] = []
    element: list[tuple[str, str, Piece]] = []
    for unit in units:
        owner = _fsdp1_owner(unit)
        params.update(_fsdp1_cut(unit, unit.flat.data, unit.flat.dtype, owner))
        if not unit.flat.requires_grad:
            continue
        infos = fsdp1.shard_infos(unit.flat)
        flat_values = state.get(id(unit.flat)) if fsdp1.original_params(unit.flat) is None else None
        held = [
            flat_values if flat_values is not None else state.get(id(unit.owners[index]))
            for index in range(len(infos))
        ]
        # One dtype per unit and key, as one gathered row of the unit has: that of the state
        # this rank holds (the flat parameter's when it holds none).
        key_dtypes = {
            key: values[key].dtype
            for values, info in zip(held, infos, strict=True)
            if values and info.in_shard
            for key in element_keys
            if key in values
        }
        for index, (name, shape) in enumerate(zip(unit.names, unit.layout.shapes, strict=True)):
            info = infos[index]
            owner_state = held[index]
            has = bool(owner_state) and info.in_shard
            names.append(name)
            local_rows.append(
                [float(has)]
                + [float(owner_state[key]) if has and key in owner_state else 0.0 for key in scalar_keys]
            )
            for key in element_keys:
                dtype = key_dtypes.get(key, unit.flat.dtype)
                piece = Piece(tuple(shape), dtype, 0, None)
                if owner and info.in_shard:
                    if has and key in owner_state:
                        value = owner_state[key].detach().reshape(-1)
                        if flat_values is not None:
                            value = value[info.offset_in_shard : info.offset_in_shard + info.numel_in_shard]
                        piece = Piece(tuple(shape), dtype, info.intra_param_start_idx, value.to(dtype))
                    else:
                        zeros = torch.zeros(info.numel_in_shard, dtype=dtype)
                        piece = Piece(tuple(shape), dtype, info.intra_param_start_idx, zeros)
                element.append((name, key, piece))
    agreed = _max_everywhere(local_rows, engine.device)
    present = {name: row[0] > 0 for name, row in zip(names, agreed, strict=True)}
    for name, key, piece in element:
        if present[name]:
            states[f"{name}:{key}"] = piece
    for name, row in zip(names, agreed, strict=True):
        if present[name]:
            for index, key in enumerate(scalar_keys, start=1):
                value = torch.tensor(row[index], dtype=torch.float32)
                states[f"{name}:{key}"] = _whole(value, _rank() == 0)
    return params, states


def _max_everywhere(rows: list[list[float]], device: torch.device) -> list[list[float]]:
    """The elementwise largest of every rank's ``rows`` (equal-sized on every rank)."""
    if not rows or not dist.is_initialized() or dist.get_world_size() == 1:
        return rows
    values = torch.tensor(rows, dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.tolist()
