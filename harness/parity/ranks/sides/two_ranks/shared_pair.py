"""Two ranks on one host exchange a large tensor through memory they share (rank side): the
reference's order-free all-reduce and its start-up broadcast, without gloo's loopback sockets.

Why: over a 2-rank group every element of a reduced gradient is the sum of two addends, and
``a + b`` is ``b + a`` (``order_free.py``), so the sum need not be gloo's to have gloo's bits: each
rank writes its elements where its peer can read them and adds its peer's to its own. Gloo moves
them through TCP on the loopback, twice over and copied at each end; measured here (2 ranks, one
thread each), 55M float32 elements in 2M-element tensors took 0.21 s a step through gloo and
0.10 s through shared memory, 10M in 0.5M-element tensors 0.09 s and 0.03 s. The exchange is
ours, so it is used only where it cannot change a bit: the reference's own tensors (never the
candidate's collectives), sums and averages (the sum halved: exact) of float32 and float64,
broadcasts of any dtype, CPU tensors of :data:`LARGE_MB` and more, two ranks that share
``/dev/shm``.

How: a segment per 2-rank group, made on first use and kept in the group's stash, holds two
buffers of two slots (one per rank) of :data:`CHUNK_MB` each. A tensor goes a chunk at a time:
each rank copies its chunk into its slot of the next buffer, the ranks meet in a 4-element gloo
all-reduce (which also checks that both sent tensors and chunks of as many elements: a mismatch
raises on both), then
each writes the two slots' sum into its chunk, rank 0's addend first on both ranks (the same bits
even for two NaNs). Alternating buffers means one meeting per chunk: a rank can only write a
buffer again after its peer has met it past its last read of it. The segment's file is unlinked
as soon as both ranks have mapped it, so no crash leaves it behind; where anything about it fails
(no ``/dev/shm``, no room, two hosts, a file of its name without the token rank 0 wrote in it),
both ranks agree to use gloo.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import torch
import torch.distributed as dist

from harness.rank import context

LARGE_MB = 1.0
"""The size from which a tensor goes through shared memory (below it a call is latency: one
gloo all-reduce, as the meeting itself costs)."""
CHUNK_MB = 4.0
"""One rank's slot: a buffer holds two, the segment two buffers (16 MiB, mapped by both ranks)."""
DTYPES = (torch.float32, torch.float64)
"""Dtypes whose two-addend sum torch and gloo round alike (one IEEE addition)."""

_PAIRS = context.GroupKey[dict[tuple[int, ...], "Pair | None"]]()
"""In the default group's stash, by the group's global ranks: its pair, or ``None`` where the
ranks agreed it cannot have one (so they do not ask again)."""


class Pair:
    """The segment of one 2-rank group (made by :func:`_pair` on both ranks together)."""

    def __init__(self, segment: torch.Tensor, me: int) -> None:
        self.segment = segment.view(2, 2, -1)
        """``[buffer][rank]``: raw bytes, one slot per rank per buffer."""
        self.me = me
        """This rank's index in the group (0 or 1)."""
        self.turn = 0
        """The buffer the next chunk goes through (alternating, the same on both ranks)."""

    def _meet(self, numel: int, total: int, group: Any) -> None:
        """Both ranks at the same chunk of tensors of as many elements, with as many in the chunk
        (a mismatch raises on both, before either reads its peer's slot)."""
        sizes = torch.tensor([numel, -numel, total, -total], dtype=torch.float64)
        dist.all_reduce(sizes, op=dist.ReduceOp.MAX, group=group)
        if sizes[0] != -sizes[1] or sizes[2] != -sizes[3]:
            raise RuntimeError(
                f"shared-memory exchange: the ranks sent tensors of {int(-sizes[3])} and {int(sizes[2])} "
                f"elements ({int(-sizes[1])} and {int(sizes[0])} in this chunk); every rank must reduce "
                "the same tensors"
            )

    def _slots(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        buffer = self.segment[self.turn]
        self.turn ^= 1
        return buffer[0].view(dtype), buffer[1].view(dtype)

    def sum_(self, tensor: torch.Tensor, group: Any) -> None:
        """``tensor`` (contiguous) replaced by its sum over the pair, chunk by chunk."""
        flat = tensor.view(-1)
        step = self.segment.shape[-1] // flat.element_size()
        for start in range(0, flat.numel(), step):
            part = flat[start : start + step]
            slots = self._slots(flat.dtype)
            slots[self.me][: part.numel()].copy_(part)
            self._meet(part.numel(), flat.numel(), group)
            torch.add(slots[0][: part.numel()], slots[1][: part.numel()], out=part)

    def broadcast_(self, tensor: torch.Tensor, source: int, group: Any) -> None:
        """``tensor`` (contiguous) replaced on both ranks by group rank ``source``'s."""
        flat = tensor.view(-1)
        step = self.segment.shape[-1] // flat.element_size()
        for start in range(0, flat.numel(), step):
            part = flat[start : start + step]
            slots = self._slots(flat.dtype)
            if self.me == source:
                slots[source][: part.numel()].copy_(part)
            self._meet(part.numel(), flat.numel(), group)
            if self.me != source:
                part.copy_(slots[source][: part.numel()])


def usable(tensor: torch.Tensor, summed: bool = True) -> bool:
    """Whether ``tensor`` may go through a pair's memory (the same answer on both ranks of a
    replicated reference: its tensors' devices, dtypes and sizes are the same everywhere); a
    broadcast (``summed=False``) copies bits, so any dtype."""
    return (
        tensor.device.type == "cpu"
        and (tensor.dtype in DTYPES or not summed)
        and tensor.is_contiguous()
        and tensor.numel() * tensor.element_size() >= LARGE_MB * 2**20
    )


def all_reduce(tensor: torch.Tensor, op: Any, group: Any = None) -> None:
    """``dist.all_reduce(tensor, op, group)`` for ``SUM`` and ``AVG``, through the pair's memory
    where the group is a pair that has one and the tensor is :func:`usable`."""
    pair = _pair(group) if usable(tensor) and op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG) else None
    if pair is None:
        dist.all_reduce(tensor, op=op, group=group)
        return
    pair.sum_(tensor, group)
    if op == dist.ReduceOp.AVG:
        tensor.div_(2)  # gloo's average: the sum, then divided by the group's size


def broadcast(tensor: torch.Tensor, source: int, group: Any = None) -> None:
    """``dist.broadcast(tensor, source, group)`` (``source``: a global rank), through the pair's
    memory where it can (:func:`all_reduce`)."""
    pair = _pair(group) if usable(tensor, summed=False) else None
    if pair is None:
        dist.broadcast(tensor, source, group=group)
        return
    pair.broadcast_(tensor, dist.get_group_rank(group or dist.group.WORLD, source), group)


def _pair(group: Any) -> Pair | None:
    """The pair of ``group`` (made on first use, by both ranks together), or ``None`` where the
    group is not 2 gloo ranks or its ranks cannot share memory."""
    group = group or dist.group.WORLD
    if dist.get_world_size(group) != 2 or dist.get_backend(group) != "gloo":
        return None
    members = tuple(dist.get_process_group_ranks(group))
    pairs = context.group_stash().setdefault(_PAIRS, dict)
    if members not in pairs:
        pairs[members] = _made(group)
    return pairs[members]


def _made(group: Any) -> Pair | None:
    """A new segment, mapped by both ranks of ``group``, or ``None`` on both where either fails.
    Rank 0 writes a token at its start; rank 1 maps the path it is sent and must read the token
    there, so two ranks that see different ``/dev/shm`` folders (two hosts, two containers) never
    add each other's stale bytes."""
    me = dist.get_rank(group)
    size = int(4 * CHUNK_MB * 2**20)
    made = _create(size) if me == 0 else None
    found: list[Any] = [None, None]
    dist.all_gather_object(found, (socket.gethostname(), made), group=group)
    (host, sent), (peer_host, _) = found
    segment = None
    if sent is not None and host == peer_host:
        path, token = sent
        try:
            segment = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        except (OSError, RuntimeError):
            segment = None
        if segment is not None and bytes(segment[: len(token)].tolist()) != token:
            segment = None  # another file of the same name: not the memory rank 0 made
    mapped = torch.tensor([float(segment is not None)])
    dist.all_reduce(mapped, op=dist.ReduceOp.MIN, group=group)
    if made is not None:
        os.unlink(made[0])  # both mapped it, or neither uses it: nothing is left in /dev/shm
    return Pair(segment, me) if mapped.item() == 1.0 and segment is not None else None


def _create(size: int) -> tuple[str, bytes] | None:
    """A ``/dev/shm`` file of ``size`` bytes, its room reserved (a page touched past the room a
    sparse file has would kill the process), and the random token written at its start; ``None``
    where that cannot be had."""
    path = f"/dev/shm/shardscale-pair-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    token = uuid.uuid4().bytes
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size)
        os.pwrite(fd, token, 0)
    except OSError:
        os.close(fd)
        os.unlink(path)
        return None
    os.close(fd)
    return path, token
