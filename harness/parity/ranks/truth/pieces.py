"""A step's global batch as the candidate's setup splits it, and the whole batch it stands for.

Why: the candidate and its DDP twin split the data the same way (the same ranks, microbatches and
normalization), so a setup that means another thing than the whole batch (a per-microbatch mean
over uneven token counts, a sampler that repeats samples to even out the ranks, statistics of a
shard of the batch) passes every parity row. The ground truth compares the split with the whole
batch, which is what a step of data-parallel training stands for: every data-parallel rank's
batch of the step, every microbatch, concatenated along the batch dimension (dim 0 of every
tensor), each sample once.

"Each sample once": a sample (row ``i`` of every tensor of a piece) that an earlier piece of the
same step already holds is a repeat (``DistributedSampler`` without ``drop_last`` pads its ranks
by repeating samples) and is left out of the whole batch. Repeats inside one piece are kept: the
user's own batch may hold a sample twice.

What the pieces see of the process: a loss may read ``torch.distributed.get_rank()``,
``get_world_size()`` or ``RANK``/``WORLD_SIZE`` (a user dividing by the world size on top of the
data-parallel average). :func:`as_process` makes each piece see its own data-parallel rank and
the data-parallel size, and the whole batch a world of one, for the duration of the call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from harness.parity.workload import registry
from harness.parity.workload.batches import tree_map
from harness.parity.workload.spec import Workload


class Unsupported(Exception):
    """The stage cannot judge this workload; the message says why (the report shows it as a skip)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Split:
    """How the candidate's setup splits a step: over ``ranks`` data-parallel ranks and
    ``microbatches`` per rank, each piece's loss weighed by :attr:`factor` as the engine and the
    data-parallel average weigh it."""

    ranks: int
    microbatches: int
    num_items: bool
    """The loss takes ``num_items`` (multiplied by ``ranks x microbatches``, ``workload/items.py``)."""
    cut: bool = False
    """The microbatches are cut from each rank's one batch along dim 0 (a pipeline schedule's
    ``torch.tensor_split``), not drawn as batches of their own (gradient accumulation)."""

    @property
    def factor(self) -> float:
        """A piece's weight in the step's gradient: ``1 / microbatches`` (the engine's division),
        ``1 / ranks`` (the average), undone for a loss that takes ``num_items``."""
        if self.num_items:
            return 1.0
        return 1.0 / (self.ranks * self.microbatches)

    def words(self) -> str:
        ranks = f"{self.ranks} data-parallel rank{'s' if self.ranks > 1 else ''}"
        if self.microbatches == 1:
            return ranks
        return f"{ranks} x {self.microbatches} microbatches" + (" cut from each batch" if self.cut else "")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Piece:
    """One data-parallel rank's batch of one microbatch."""

    rank: int
    microbatch: int
    index: int
    """The workload's batch index (``step * microbatches + microbatch``)."""
    batch: Any

    def name(self) -> str:
        return f"rank {self.rank} microbatch {self.microbatch}"


def step_pieces(workload: Workload, seed: int, split: Split, step: int) -> list[Piece]:
    """Every piece of ``step``, rank by rank, microbatch by microbatch, in float64."""
    if split.cut:
        return _cut_pieces(workload, seed, split, step)
    pieces = []
    for rank in range(split.ranks):
        for microbatch in range(split.microbatches):
            index = step * split.microbatches + microbatch
            with as_process(rank, split.ranks):  # a sampler reads the process it serves
                batch = to_float64(registry.make_batch(workload, seed, rank, index))
            pieces.append(Piece(rank=rank, microbatch=microbatch, index=index, batch=batch))
    return pieces


def _cut_pieces(workload: Workload, seed: int, split: Split, step: int) -> list[Piece]:
    """Each rank's batch of ``step`` cut along dim 0 into the microbatches, as a pipeline's
    schedule cuts it (every tensor of the batch alike)."""
    found = []
    for rank in range(split.ranks):
        with as_process(rank, split.ranks):
            batch = to_float64(registry.make_batch(workload, seed, rank, step))
        leaves = [leaf for _, leaf in _leaves(batch)]
        parts = [
            torch.tensor_split(leaf, split.microbatches) if isinstance(leaf, torch.Tensor) else None
            for leaf in leaves
        ]
        for microbatch in range(split.microbatches):
            cut = [
                leaf if part is None else part[microbatch] for leaf, part in zip(leaves, parts, strict=True)
            ]
            found.append(
                Piece(rank=rank, microbatch=microbatch, index=step, batch=_rebuild(batch, iter(cut)))
            )
    return found


def to_float64(batch: Any) -> Any:
    """``batch`` with its floating-point tensors in float64 (integers stay: token ids, labels)."""
    return tree_map(batch, lambda t: t.double() if t.is_floating_point() else t)


def _leaves(batch: Any, path: str = "batch") -> list[tuple[str, Any]]:
    """``(where, leaf)`` of every leaf of ``batch``, in a fixed order."""
    if isinstance(batch, dict):
        return [leaf for key in batch for leaf in _leaves(batch[key], f"{path}[{key!r}]")]
    if isinstance(batch, (list, tuple)) and not hasattr(batch, "_fields"):
        return [leaf for i, value in enumerate(batch) for leaf in _leaves(value, f"{path}[{i}]")]
    return [(path, batch)]


def _rebuild(like: Any, leaves: Iterator[Any]) -> Any:
    if isinstance(like, dict):
        return {key: _rebuild(value, leaves) for key, value in like.items()}
    if isinstance(like, (list, tuple)) and not hasattr(like, "_fields"):
        return type(like)(_rebuild(value, leaves) for value in like)
    return next(leaves)


def samples(batch: Any) -> int:
    """The batch's size along dim 0, the same for every tensor it holds (else :class:`Unsupported`)."""
    sizes = {}
    for where, leaf in _leaves(batch):
        if isinstance(leaf, torch.Tensor):
            if leaf.dim() == 0:
                raise Unsupported(
                    f"{where} is a tensor without a batch dimension: the stage concatenates the "
                    "pieces' batches along dim 0"
                )
            sizes[where] = leaf.shape[0]
    if not sizes:
        raise Unsupported("the batch holds no tensor to concatenate")
    if len(set(sizes.values())) > 1:
        raise Unsupported(
            f"the batch's tensors differ in their first dimension ({sizes}): no batch dimension"
        )
    return next(iter(sizes.values()))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Whole:
    """The whole batch of a step, and the samples left out of it as repeats."""

    batch: Any
    repeats: tuple[str, ...]
    """``"rank 1 microbatch 0 row 3 = rank 0 microbatch 0 row 0"``, one per repeated sample."""


def whole_batch(pieces: list[Piece], drop_repeats: bool = True) -> Whole:
    """The pieces concatenated along dim 0, each sample once (``drop_repeats``) or as served."""
    structure = [_leaves(piece.batch) for piece in pieces]
    first = structure[0]
    for piece, leaves in zip(pieces, structure, strict=True):
        if [where for where, _ in leaves] != [where for where, _ in first]:
            raise Unsupported(f"{piece.name()}'s batch is not shaped like the first piece's")
    kept: list[list[int]] = []
    repeats = []
    seen: dict[bytes, tuple[int, str]] = {}
    for number, piece in enumerate(pieces):
        rows = []
        for row in range(samples(piece.batch)):
            key = b"".join(
                leaf[row].contiguous().numpy().tobytes() if isinstance(leaf, torch.Tensor) else b""
                for _, leaf in structure[number]
            )
            earlier = seen.get(key)
            if drop_repeats and earlier is not None and earlier[0] != number:
                repeats.append(f"{piece.name()} row {row} = {earlier[1]}")
                continue
            seen.setdefault(key, (number, f"{piece.name()} row {row}"))
            rows.append(row)
        kept.append(rows)
    joined = []
    for position, (where, leaf) in enumerate(first):
        values = [leaves[position][1] for leaves in structure]
        if isinstance(leaf, torch.Tensor):
            parts = [value[rows] for value, rows in zip(values, kept, strict=True)]
            if len({part.shape[1:] for part in parts}) > 1:
                raise Unsupported(
                    f"{where} has other shapes past dim 0 in different pieces "
                    f"({sorted({tuple(p.shape) for p in parts})}): they cannot be concatenated unpadded"
                )
            joined.append(torch.cat(parts))
        elif any(value != leaf for value in values):
            raise Unsupported(f"{where} is not a tensor and differs between pieces: {values[:4]}")
        else:
            joined.append(leaf)
    return Whole(batch=_rebuild(pieces[0].batch, iter(joined)), repeats=tuple(repeats))


def reversed_rows(batch: Any) -> Any:
    """``batch`` with its samples in reverse order: the same mathematics, summed in another order."""
    return tree_map(batch, lambda t: t.flip(0) if t.dim() > 0 else t)


_VIEW = threading.local()
"""The calling thread's ``(rank, world size)`` while :func:`as_process` holds it (a lockstep's
pieces run side by side in threads, ``lockstep.py``)."""


def _view() -> tuple[int, int] | None:
    return getattr(_VIEW, "value", None)


@contextlib.contextmanager
def _viewed() -> Iterator[None]:
    """``torch.distributed.get_rank``/``get_world_size`` answering the calling thread's view (the
    ones they replace outside any view), inside; entered by the main thread only, so nested
    entries restore in the order they were made."""
    outer_rank, outer_world = dist.get_rank, dist.get_world_size

    def get_rank(group: Any = None) -> int:
        view = _view()
        return view[0] if view is not None else outer_rank(group)

    def get_world_size(group: Any = None) -> int:
        view = _view()
        return view[1] if view is not None else outer_world(group)

    dist.get_rank = get_rank  # type: ignore[assignment]
    dist.get_world_size = get_world_size  # type: ignore[assignment]
    try:
        yield
    finally:
        dist.get_rank = outer_rank  # type: ignore[assignment]
        dist.get_world_size = outer_world  # type: ignore[assignment]


@contextlib.contextmanager
def as_process(rank: int, world_size: int) -> Iterator[None]:
    """``torch.distributed.get_rank``/``get_world_size`` as a process ``rank`` of ``world_size``
    sees them, in the calling thread, inside (restored after); in the main thread also
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` (the environment is the process's: a lockstep's threads
    leave it to the main thread's view, and answer through the functions the main thread put in
    place, ``lockstep.losses`` running them inside its own view)."""
    saved_view = _view()
    main = threading.current_thread() is threading.main_thread()
    saved_env = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with _viewed() if main else contextlib.nullcontext():
        _VIEW.value = (rank, world_size)
        if main:
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        try:
            yield
        finally:
            _VIEW.value = saved_view
            if main:
                for name, value in saved_env.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value
