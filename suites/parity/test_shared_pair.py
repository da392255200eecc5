"""Two ranks on one host exchange the reference's large tensors through shared memory
(``shared_pair.py``): gloo's bits, no tensor on gloo's sockets, nothing left in ``/dev/shm``, and
both ranks fall back to gloo together where they cannot share."""

from __future__ import annotations

import pytest
import torch

ELEMENTS = 2_500_000
"""10 MB of float32: three chunks of the segment's 4 MiB slots, the last one short."""


def _exchanged(kind: str, dtype: torch.dtype = torch.float32) -> tuple[bool, int, list[int]]:
    """On each rank: a tensor of this rank's own values all-reduced (``kind``: ``sum``, ``avg``) or
    broadcast from rank 0 through the pair, against gloo's own call on a copy: whether the bits
    agree, the largest tensor gloo was given during the exchange, and the sizes it was given."""
    import torch.distributed as dist

    from harness.parity.ranks.sides.two_ranks import shared_pair

    generator = torch.Generator().manual_seed(dist.get_rank())
    mine = (torch.randn(ELEMENTS, generator=generator) * 1e-3).to(dtype)
    expected = mine.clone()
    if kind == "broadcast":
        dist.broadcast(expected, 0)
    else:
        dist.all_reduce(expected, op=dist.ReduceOp.SUM if kind == "sum" else dist.ReduceOp.AVG)
    shared_pair._pair(dist.group.WORLD)  # made on first use (an agreement of its own), kept
    sizes, all_reduce, broadcast = [], dist.all_reduce, dist.broadcast

    def counted(tensor, *args, **kwargs):
        sizes.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    def counted_broadcast(tensor, *args, **kwargs):
        sizes.append(tensor.numel())
        return broadcast(tensor, *args, **kwargs)

    dist.all_reduce, dist.broadcast = counted, counted_broadcast
    try:
        if kind == "broadcast":
            shared_pair.broadcast(mine, 0)
        else:
            shared_pair.all_reduce(mine, dist.ReduceOp.SUM if kind == "sum" else dist.ReduceOp.AVG)
    finally:
        dist.all_reduce, dist.broadcast = all_reduce, broadcast
    return torch.equal(mine, expected), max(sizes), sizes


@pytest.mark.parametrize("kind", ["sum", "avg", "broadcast"])
def test_a_large_float32_tensor_goes_through_shared_memory_with_gloos_bits(ranks, kind):
    """Three chunks, each a 4-element meeting on gloo (the sizes checked), none of the tensor."""
    found = ranks.run(_exchanged, kind, world_size=2)
    assert [same for same, _, _ in found] == [True, True]
    assert [largest for _, largest, _ in found] == [4, 4]
    assert [len(sizes) for _, _, sizes in found] == [3, 3]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_low_precision_sum_stays_on_gloo(ranks, dtype):
    """A 16-bit sum is rounded from float32 by gloo; only one IEEE addition is sure to match."""
    found = ranks.run(_exchanged, "sum", dtype, world_size=2)
    assert [(same, sizes) for same, _, sizes in found] == [(True, [ELEMENTS])] * 2


def test_a_low_precision_broadcast_goes_through_shared_memory(ranks):
    """A broadcast copies bits: a bfloat16 working copy's parameters (5 MB: two chunks)."""
    found = ranks.run(_exchanged, "broadcast", torch.bfloat16, world_size=2)
    assert [(same, sizes) for same, _, sizes in found] == [(True, [4, 4])] * 2


def _small_tensor_sizes() -> list[int]:
    import torch.distributed as dist

    from harness.parity.ranks.sides.two_ranks import shared_pair

    sizes, all_reduce = [], dist.all_reduce
    dist.all_reduce = lambda tensor, *a, **k: (sizes.append(tensor.numel()), all_reduce(tensor, *a, **k))[1]
    try:
        shared_pair.all_reduce(torch.ones(1000), dist.ReduceOp.SUM)
    finally:
        dist.all_reduce = all_reduce
    return sizes


def test_a_small_tensor_stays_on_gloo_in_one_call(ranks):
    """Below 1 MiB a call is latency, which a meeting costs as much as gloo's own call."""
    assert ranks.run(_small_tensor_sizes, world_size=2) == [[1000], [1000]]


def _nan_bits() -> list[int]:
    import torch.distributed as dist

    from harness.parity.ranks.sides.two_ranks import shared_pair

    payloads = [0x7FC00001, 0x7FC00002]  # a different quiet NaN on each rank
    tensor = torch.zeros(ELEMENTS)
    tensor.view(torch.int32)[0] = payloads[dist.get_rank()]
    shared_pair.all_reduce(tensor, dist.ReduceOp.SUM)
    return [int(tensor.view(torch.int32)[0])]


def test_two_nans_sum_to_the_same_bits_on_both_ranks(ranks):
    """Rank 0's addend first on both ranks: a replicated reference stays bitwise replicated."""
    first, second = ranks.run(_nan_bits, world_size=2)
    assert first == second


def _mismatched(extra: int) -> str:
    import torch.distributed as dist

    from harness.parity.ranks.sides.two_ranks import shared_pair

    try:
        shared_pair.all_reduce(torch.ones(ELEMENTS + extra * dist.get_rank()), dist.ReduceOp.SUM)
    except RuntimeError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("extra", [1, 1_000_000], ids=["last-chunk", "a-chunk-more"])
def test_ranks_that_send_different_sizes_both_raise_naming_the_sizes(ranks, extra):
    """Whether the chunks differ at the end or one rank has a whole chunk more, both raise at the
    first meeting, before either reads its peer's slot or runs into another collective."""
    found = ranks.run(_mismatched, extra, world_size=2)
    assert found[0] == found[1], found
    assert f"tensors of {ELEMENTS} and {ELEMENTS + extra} elements" in found[0], found[0]


def _fallback(where: str) -> tuple[bool, list[str]]:
    """``where``: ``one-host``; ``two-hosts`` (each rank names its own host); ``two-folders`` (rank
    1 finds a file of the same name that is not rank 0's: another container's ``/dev/shm``)."""
    import os
    import socket
    import tempfile

    import torch.distributed as dist

    from harness.parity.ranks.sides.two_ranks import shared_pair

    hostname, from_file, create = socket.gethostname, torch.from_file, shared_pair._create
    created: list[str] = []

    def recorded(size):
        made = create(size)
        created.extend([made[0]] if made is not None else [])
        return made

    shared_pair._create = recorded
    if where == "two-hosts":
        socket.gethostname = lambda: f"host-{dist.get_rank()}"
    if where == "two-folders" and dist.get_rank() == 1:
        other = tempfile.NamedTemporaryFile()  # noqa: SIM115 - kept open for the mapping
        other.truncate(int(4 * shared_pair.CHUNK_MB * 2**20))
        torch.from_file = lambda path, **kwargs: from_file(other.name, **kwargs)
    try:
        made = shared_pair._made(dist.group.WORLD)
    finally:
        socket.gethostname, torch.from_file, shared_pair._create = hostname, from_file, create
    assert created or dist.get_rank() == 1, "rank 0 made the segment's file"
    return made is not None, [path for path in created if os.path.exists(path)]


@pytest.mark.parametrize("where", ["one-host", "two-hosts", "two-folders"])
def test_a_segment_is_unlinked_once_made_and_ranks_that_cannot_share_it_use_gloo(ranks, where):
    """The file is gone as soon as both ranks mapped it (or did not): no crash leaves it behind.
    Two hosts, or a peer whose file of that name holds another's bytes, agree to use gloo."""
    assert ranks.run(_fallback, where, world_size=2) == [(where == "one-host", [])] * 2
