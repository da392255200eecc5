"""The reference steps a fused optimizer over its candidate's local shards (rank side), so that
every element sits at the offset it has on the candidate and rounds the same way.

Why: a fused optimizer's CPU kernel (``Adam(fused=True)``, torch 2.13) walks each tensor it is
given in cache-line blocks of 16 float32 elements, each block in vectors of the machine's width
(16 lanes on AVX-512, 8 on AVX2 and ``ATEN_CPU_CAPABILITY=default``), and the last
``numel % width`` elements of the tensor in a scalar loop. The vector body and the scalar tail
compute the same formula with other roundings (the vector body's moment update is one fused
multiply-add), so an element rounds by the class of its position in the tensor, and the class
depends only on the tensor's length and the element's offset (never on threads or memory
alignment: the blocks are multiples of every width). FSDP hands the optimizer each rank's shard:
FSDP2 a dim-0 chunk of each parameter, FSDP1 its flat shard (several parameters and their
padding, or with ``use_orig_params`` each parameter's part of it). A reference that steps whole
parameters puts the tail elsewhere, and a few elements a step come out one float32 ulp apart
(measured: 36 of 30 000 elements over 6 steps, 0 under ``ATEN_CPU_CAPABILITY=default``, whose
vectors round as its scalars do). Stepped here over the same pieces, in the same lengths, with its
state in the same layout, each element takes the candidate's path on every machine, and the update
is bitwise (``plan/profiles.py``: ``exact``).

How: the optimizer the reference builds (over its full parameters, keeping full-shaped state:
everything that reads it, the scaler, the schedulers, the record and the anchor, reads it as
before) takes a step by lending its own ``step`` every rank's pieces instead of its parameters:
each piece a tensor of its own, the parameters', gradients' and state's elements copied in at the
candidate's offsets (zeros where the candidate pads), stepped, and copied back. Copies round
nothing. Only fused optimizers step so (``defaults["fused"]``); the others are measured bitwise over
whole tensors already.

The pieces follow the candidate's layout as ``reduce_layout.Layout`` states it; what each engine
hands its optimizer, read in torch 2.13's sources (``_fsdp_param.py``, ``_flat_param.py``):

* **FSDP2**: rank ``r`` of the shard group holds rows ``[r * c, (r + 1) * c)`` of each parameter,
  ``c = ceil(rows / shards)`` (the padding past the last row is not part of the local tensor);
  with tensor parallelism, the same of the TP rank's chunk on the dim its plan shards.
* **FSDP1**, flat parameters: the unit's flat buffer (``reduce_layout.flat_starts``) cut into
  ``shards`` equal slices, each one tensor holding parts of several parameters and the end padding.
* **FSDP1**, ``use_orig_params``: each parameter's part of each slice, a tensor of its own.
* **FSDP1** ``NO_SHARD`` with flat parameters: the whole flat buffer, one tensor.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from harness.parity.ranks.sides import reduce_layout


@dataclasses.dataclass(frozen=True, slots=True)
class Part:
    """The elements of one parameter that one piece holds, contiguous in the piece."""

    param: int
    """The parameter, by index into the model's ``parameters()``."""
    narrows: tuple[tuple[int, int, int], ...]
    """``(dim, start, length)`` applied in turn to the parameter (to its flattened view if
    :attr:`flat`): the region, in the candidate's element order."""
    flat: bool
    offset: int
    """Where the region's first element sits in the piece."""

    def of(self, tensor: torch.Tensor) -> torch.Tensor:
        """This part's region of ``tensor`` (the parameter, its gradient or a state tensor), a view."""
        view = tensor.view(-1) if self.flat else tensor  # a view: writes reach the tensor
        for dim, start, length in self.narrows:
            view = view.narrow(dim, start, length)
        return view


@dataclasses.dataclass(frozen=True, slots=True)
class Piece:
    """One tensor the candidate's optimizer steps on some rank: its parts, and its shape (its
    elements beyond the parts are the candidate's padding: zeros)."""

    parts: tuple[Part, ...]
    shape: tuple[int, ...]


def pieces(
    layout: reduce_layout.Layout | None, shapes: list[torch.Size], world_size: int
) -> tuple[Piece, ...] | None:
    """Every rank's pieces of the parameters (``shapes``, ``parameters()`` order) under
    ``layout`` at ``world_size`` (``None``: whole tensors, as DDP steps them); a rank's empty shard
    is no piece (the candidate steps nothing there)."""
    if layout is None or layout.engine not in ("fsdp1", "fsdp2"):
        return None
    shards = _shard_size(layout, world_size)
    found: list[Piece] = []
    for bucket in layout.buckets:
        if layout.engine == "fsdp2":
            for index in bucket.params:
                dim = layout.tp_dims[index] if layout.tp_dims else None
                found += _fsdp2(index, shapes[index], shards, dim, layout)
        else:
            found += _fsdp1(bucket, [math.prod(shapes[i]) for i in bucket.params], shards, layout)
    return tuple(piece for piece in found if math.prod(piece.shape))


def _shard_size(layout: reduce_layout.Layout, world_size: int) -> int:
    """How many ranks a sharded candidate splits each parameter over: the world, FSDP1
    ``HYBRID_SHARD``'s shard groups of 2, an FSDP2 mesh's ``shard`` (HSDP) or ``dp`` (TP) dimension."""
    if layout.mesh is not None:
        (rows, columns), names = layout.mesh
        return rows if names == ("dp", "tp") else columns
    return 2 if layout.hybrid else world_size


def _rows(size: int, parts: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each of ``parts`` chunks of ``size`` rows, as ``torch.chunk`` and
    FSDP2 cut them (``ceil(size / parts)`` each; the last ones shorter or empty)."""
    each = -(-size // parts) if size else 0
    return [(min(r * each, size), max(0, min(size, (r + 1) * each) - r * each)) for r in range(parts)]


def _fsdp2(
    index: int, shape: torch.Size, shards: int, tp_dim: int | None, layout: reduce_layout.Layout
) -> list[Piece]:
    if not shape:  # a 0-d parameter: whole on every rank
        return [Piece((Part(index, (), False, 0),), ())]
    shares: list[tuple[tuple[int, int, int], ...]] = [()]
    sizes = [tuple(shape)]
    if tp_dim is not None:
        assert layout.mesh is not None, "TP dims come with a mesh"
        (_, tp), _ = layout.mesh
        shares, sizes = [], []
        for start, length in _rows(shape[tp_dim], tp):
            shares.append(((tp_dim, start, length),))
            sizes.append(tuple(length if d == tp_dim else n for d, n in enumerate(shape)))
    found = []
    for share, size in zip(shares, sizes, strict=True):
        for start, length in _rows(size[0], shards):
            region = (*share, (0, start, length))
            found.append(Piece((Part(index, region, False, 0),), (length, *size[1:])))
    return found


def _fsdp1(
    bucket: reduce_layout.Bucket, numels: list[int], shards: int, layout: reduce_layout.Layout
) -> list[Piece]:
    padded_to = shards if bucket.align or layout.sharded else None
    starts, total = reduce_layout.flat_starts(numels, bucket.align, padded_to)
    slices = (
        [(r * (total // shards), total // shards) for r in range(shards)] if layout.sharded else [(0, total)]
    )
    found = []
    for lo, length in slices:
        parts = []
        for index, start, numel in zip(bucket.params, starts, numels, strict=True):
            first, last = max(start, lo), min(start + numel, lo + length)
            if first < last:
                parts.append(Part(index, ((0, first - start, last - first),), True, first - lo))
        if layout.orig_params:  # each parameter's part of the slice, a tensor of its own
            found += [Piece((dataclasses.replace(p, offset=0),), (p.narrows[0][2],)) for p in parts]
        else:
            found.append(Piece(tuple(parts), (length,)))
    return found


def mirror(
    optimizer: torch.optim.Optimizer,
    params: list[torch.Tensor],
    layout_now: Callable[[], reduce_layout.Layout | None],
    world_size: int,
) -> torch.optim.Optimizer:
    """``optimizer`` (over some of ``params``, the reference's parameters in ``parameters()``
    order), made to step over the candidate's pieces at ``world_size`` if it is fused; returned as
    it is otherwise. ``layout_now``: the candidate's layout at the current step (a resume row's
    reference changes layout where its candidate resumes in another).

    Its ``step`` becomes a method of the optimizer's (an LR scheduler re-binds it to wrap it)."""
    if not optimizer.defaults.get("fused"):
        return optimizer
    stepper = PieceStep(optimizer, params, layout_now, world_size)

    def step(self: torch.optim.Optimizer, closure: Any = None) -> Any:
        return stepper(closure)

    optimizer.step = types.MethodType(step, optimizer)  # type: ignore[method-assign]
    return optimizer


class PieceStep:
    """One optimizer's step over the pieces (module docstring), with the pieces' own tensors and
    state, per layout."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.Tensor],
        layout_now: Callable[[], reduce_layout.Layout | None],
        world_size: int,
    ) -> None:
        self.optimizer = optimizer
        self.world_size = world_size
        self.own_step = optimizer.step
        self.params = params
        self.layout_now = layout_now
        self._cut: dict[int, tuple[tuple[Piece, ...] | None, list[torch.Tensor], Any]] = {}
        """Per layout (by ``id``): its pieces, one tensor per piece, and their optimizer state."""

    def __call__(self, closure: Any = None) -> Any:
        layout = self.layout_now()
        if id(layout) not in self._cut:
            cut = pieces(layout, [p.shape for p in self.params], self.world_size)
            tensors = [] if cut is None else [self._new(piece) for piece in cut]
            self._cut[id(layout)] = (cut, tensors, collections.defaultdict(dict))
        cut, tensors, state = self._cut[id(layout)]
        if cut is None:
            return self.own_step(closure)
        owned = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
        held = []
        for piece, tensor in zip(cut, tensors, strict=True):
            mine = [
                p
                for p in piece.parts
                if id(self.params[p.param]) in owned and self.params[p.param].grad is not None
            ]
            if mine:
                self._copy_in(piece, mine, tensor, state)
                held.append((mine, tensor))
        with self._lent(held, state):
            found = self.own_step(closure)
        for mine, tensor in held:
            self._copy_out(mine, tensor, state[tensor])
        return found

    def _new(self, piece: Piece) -> torch.Tensor:
        first = self.params[piece.parts[0].param]
        return torch.zeros(piece.shape, dtype=first.dtype, device=first.device)

    def _copy_in(self, piece: Piece, mine: list[Part], tensor: torch.Tensor, state: Any) -> None:
        """The piece's parameter and gradient elements from the full tensors (every part: the
        candidate's shard holds them all; zeros for a part without a gradient), and its state from
        the full state of the parts it steps (``mine``: this optimizer's, with a gradient)."""
        grad = torch.zeros_like(tensor)
        with torch.no_grad():
            for part in piece.parts:
                param = self.params[part.param]
                _region(tensor, part).copy_(part.of(param))
                if param.grad is not None:
                    _region(grad, part).copy_(part.of(param.grad))
        tensor.grad = grad
        full = self.optimizer.state.get(self.params[mine[0].param])
        if not full:  # the full state leads: none there (not stepped yet) is none here
            state.pop(tensor, None)
            return
        own = state[tensor]
        for key, value in full.items():
            own[key] = self._state_in(mine, key, value, own.get(key), tensor)

    def _state_in(self, mine: list[Part], key: str, value: Any, current: Any, tensor: torch.Tensor) -> Any:
        if not _per_element(value, self.params[mine[0].param]):
            return value.clone() if isinstance(value, torch.Tensor) else value
        out = current if isinstance(current, torch.Tensor) else torch.zeros_like(tensor, dtype=value.dtype)
        with torch.no_grad():
            for part in mine:
                held = self.optimizer.state.get(self.params[part.param], {}).get(key)
                if held is not None:
                    _region(out, part).copy_(part.of(held))
        return out

    def _copy_out(self, mine: list[Part], tensor: torch.Tensor, own: dict[str, Any]) -> None:
        """The stepped piece back into the full parameters, gradients (a fused step unscales them
        in place) and state of the parts it stepped; a padding's or another part's elements are the
        candidate's business, and the reference leaves them."""
        assert tensor.grad is not None, "a held piece has a gradient"
        with torch.no_grad():
            for part in mine:
                param = self.params[part.param]
                part.of(param).copy_(_region(tensor, part))
                part.of(param.grad).copy_(_region(tensor.grad, part))
                full = self.optimizer.state[param]
                for key, value in own.items():
                    if not _per_element(value, tensor):
                        full[key] = value.clone() if isinstance(value, torch.Tensor) else value
                        continue
                    if not isinstance(full.get(key), torch.Tensor) or full[key].shape != param.shape:
                        full[key] = torch.zeros_like(param, dtype=value.dtype)
                    part.of(full[key]).copy_(_region(value, part))

    @contextlib.contextmanager
    def _lent(self, held: list[tuple[list[Part], torch.Tensor]], state: Any) -> Iterator[None]:
        """The optimizer's parameter groups and state lent to the pieces for one step: each piece
        in the group of the parameters it steps."""
        opt = self.optimizer
        group_of = {id(p): g for g, group in enumerate(opt.param_groups) for p in group["params"]}
        saved = [group["params"] for group in opt.param_groups]
        saved_state = opt.state
        lent: list[list[torch.Tensor]] = [[] for _ in saved]
        for mine, tensor in held:
            lent[group_of[id(self.params[mine[0].param])]].append(tensor)
        try:
            for group, tensors in zip(opt.param_groups, lent, strict=True):
                group["params"] = tensors
            opt.state = state
            yield
        finally:
            for group, params in zip(opt.param_groups, saved, strict=True):
                group["params"] = params
            opt.state = saved_state


def _region(tensor: torch.Tensor, part: Part) -> torch.Tensor:
    """``part``'s elements in its piece ``tensor``, shaped as its region of the parameter (an FSDP2
    piece is exactly its one region; an FSDP1 part is a run of the flat piece)."""
    if not part.flat:
        return tensor
    return tensor.view(-1)[part.offset : part.offset + part.narrows[0][2]]


def _per_element(value: Any, like: torch.Tensor) -> bool:
    """Whether a state entry holds one value per element (``exp_avg``), not one per tensor (``step``)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == like.shape
