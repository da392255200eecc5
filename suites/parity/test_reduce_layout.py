"""The candidate's gradient buffers as the reference lays them out (``ranks/sides/reduce_layout.py``):
which parameters share a collective, in which order, with which alignment. Pure: no ranks (the
reduction itself is checked bitwise at world size 4 in ``test_world_size.py``), but for the one
call a shard group of 2 reduces in, run on ranks against another order of summation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.sides import reduce_layout


class _Unit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)


class _Net(nn.Module):
    """``inp``, two units, ``head``: the root owns ``inp`` and ``head``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(3, 3)
        self.a = _Unit()
        self.b = _Unit()
        self.head = nn.Linear(3, 2)


def _names(model: nn.Module, layout: reduce_layout.Layout) -> list[list[str]]:
    names = [name for name, _ in model.named_parameters()]
    return [[names[i] for i in bucket.params] for bucket in layout.buckets]


def _layout(model: nn.Module, dtype: torch.dtype = torch.float32, **config: object) -> reduce_layout.Layout:
    return reduce_layout.of(ParityConfig.from_flat(**config), model, [model.a, model.b], dtype)


def test_each_unit_is_a_bucket_of_its_own_parameters_and_the_root_holds_the_rest():
    model = _Net()
    layout = _layout(model, engine="fsdp2", reshard_after_forward=True)
    assert _names(model, layout) == [
        ["a.fc.weight", "a.fc.bias"],
        ["b.fc.weight", "b.fc.bias"],
        ["inp.weight", "inp.bias", "head.weight", "head.bias"],
    ]
    assert all(bucket.align == 0 for bucket in layout.buckets)


def test_fsdp1_aligns_each_parameter_to_16_bytes_of_the_compute_dtype_only_with_orig_params():
    model = _Net()
    orig = dict(engine="fsdp1", sharding="full_shard", use_orig_params=True)
    assert {b.align for b in _layout(model, torch.float32, **orig).buckets} == {4}
    assert {b.align for b in _layout(model, torch.bfloat16, **orig).buckets} == {8}
    flat = dict(engine="fsdp1", sharding="full_shard", use_orig_params=False)
    assert {b.align for b in _layout(model, **flat).buckets} == {0}


def test_fsdp1_strategies_say_how_the_flat_gradient_is_reduced():
    model = _Net()
    full = _layout(model, engine="fsdp1", sharding="full_shard", use_orig_params=False)
    no_shard = _layout(model, engine="fsdp1", sharding="no_shard", use_orig_params=False)
    hybrid = _layout(model, engine="fsdp1", sharding="hybrid_shard", use_orig_params=False, world_size=4)
    assert (full.sharded, full.hybrid) == (True, False)
    assert (no_shard.sharded, no_shard.hybrid) == (False, False)
    assert (hybrid.sharded, hybrid.hybrid) == (True, True)


def test_a_parameter_two_units_share_goes_to_the_unit_fsdp1_wraps_first():
    """FSDP1 wraps bottom-up in module order, so the earlier unit's flat parameter takes it
    (measured: ``a``'s flat parameter holds ``fc.weight`` and ``fc.bias``, ``b``'s ``fc.bias``)."""
    model = _Net()
    model.b.fc.weight = model.a.fc.weight
    fsdp1 = _names(model, _layout(model, engine="fsdp1", sharding="full_shard", use_orig_params=True))
    assert fsdp1[:2] == [["a.fc.weight", "a.fc.bias"], ["b.fc.bias"]]


def test_a_ddp_candidate_reduces_every_gradient_in_one_buffer():
    model = _Net()
    (bucket,) = _layout(model, engine="ddp").buckets
    assert bucket.params == tuple(range(len(list(model.parameters()))))


class _Mesh:
    """A stand-in device mesh: each dimension's group is its name."""

    def __init__(self, shape: tuple[int, ...], names: tuple[str, ...] | None) -> None:
        self.shape, self.names = shape, names

    def __getitem__(self, name: str) -> object:
        class _Dim:
            @staticmethod
            def get_group() -> str:
                return name

        return _Dim()


_HSDP_2X2 = ((2, 2), ("replicate", "shard"))
_TP_2 = ((2, 2), ("dp", "tp"))


@pytest.mark.parametrize(
    ("layout", "groups"),
    [
        (reduce_layout.Layout(engine="fsdp2", buckets=(), mesh=_HSDP_2X2), ("shard", "replicate")),
        (
            reduce_layout.Layout(engine="fsdp2", buckets=(), mesh=((4, 1), ("replicate", "shard"))),
            ("shard", "replicate"),
        ),
        (reduce_layout.Layout(engine="fsdp2", buckets=(), mesh=_TP_2), ("dp", None)),
        (reduce_layout.Layout(engine="fsdp1", buckets=(), hybrid=True), ("shard", "replicate")),
    ],
    ids=["hsdp2x2", "hsdp4x1", "tp2", "fsdp1-hybrid_shard"],
)
def test_the_reference_reduces_over_the_groups_its_candidate_reduces_over(layout, groups, monkeypatch):
    """``(shard group, replicate group)`` of each 2-D layout, as its candidate's mesh names them:
    HSDP reduce-scatters within a shard group, then all-reduces across the replicas (swapped, the
    buffer is scattered over other ranks than the candidate's); TP reduces over ``dp`` alone (the
    whole world would add each TP rank's share into the others'); FSDP1's HYBRID_SHARD over its
    shard groups of 2, then across them. Its meshes stood in for: no process group."""
    from harness.parity.ranks.sides.full import gather

    made: list[tuple] = []
    monkeypatch.setattr(
        gather, "mesh", lambda device, shape, names: made.append((shape, names)) or _Mesh(shape, names)
    )
    monkeypatch.setattr(reduce_layout.dist, "get_world_size", lambda group=None: 4)
    assert reduce_layout._groups(layout, torch.device("cpu")) == groups
    expected = layout.mesh or ((2, 2), ("replicate", "shard"))
    assert made == [expected]


_SIZES = {"shard": 2, "replicate": 2, "dp": 2, "one": 1, "four": 4, None: 4}
"""The stand-in groups' sizes (``None``: the default group, the whole world of 4)."""


@pytest.mark.parametrize(
    ("layout", "groups", "factors", "op"),
    [
        (_HSDP_2X2, ("shard", "replicate"), (None, 4.0), ("AVG", None, None)),
        (((4, 1), ("replicate", "shard")), ("one", "four"), (None, 4.0), ("AVG", None, None)),
        (_TP_2, ("dp", None), (None, 2.0), ("AVG", None, None)),
        (_HSDP_2X2, ("shard", "replicate"), (2.0, 2.0), ("SUM", 2.0, 2.0)),
        (_TP_2, ("dp", None), (None, 4.0), ("SUM", None, 4.0)),
    ],
    ids=["hsdp2x2", "hsdp4x1", "tp2", "hsdp2x2-fp16", "tp2-over-the-world"],
)
def test_fsdp2_averages_in_its_collectives_exactly_where_its_factor_is_its_data_parallel_size(
    layout, groups, factors, op, monkeypatch
):
    """FSDP2 reduces with ``ReduceOp.AVG`` in each stage (reduce-scatter over the shard group,
    all-reduce over the replicas) when its factor is the mean over every data-parallel rank: that
    count is the shard group's size times the replicate group's (HSDP: both; TP: ``dp`` only, no
    replicas). Counted over one group only, or over the whole world under TP, the reference sums
    and divides instead: the same bits on gloo at these sizes, other roundings on NCCL, whose
    ``AVG`` pre-multiplies in the reduce dtype. A factor that is not that mean (fp16's split, or
    the world's under TP) is summed and divided as given."""
    monkeypatch.setattr(reduce_layout.dist, "get_world_size", lambda group=None: _SIZES[group])
    found = reduce_layout._op(reduce_layout.Layout(engine="fsdp2", buckets=(), mesh=layout), factors, groups)
    name = {reduce_layout.dist.ReduceOp.AVG: "AVG", reduce_layout.dist.ReduceOp.SUM: "SUM"}[found[0]]
    assert (name, *found[1:]) == op


_ENGINES = [
    dict(engine="fsdp2", reshard_after_forward=True),
    dict(engine="fsdp1", sharding="full_shard", use_orig_params=True),
    dict(engine="fsdp1", sharding="no_shard", use_orig_params=False),
]


def _reduced_both_ways(
    config: dict, dtype: torch.dtype, one_call_mb: float | None = None
) -> tuple[bool, int]:
    """On each of 2 ranks: this rank's gradients of ``_Net`` reduced in the order-free calls (one,
    or one a bucket where ``one_call_mb`` is too small for them), and in every bucket's own with
    the ranks summed in reverse order; whether the bits agree, and how many collectives the
    order-free calls made (all-reduces; any other collective fails)."""
    import torch.distributed as dist

    from harness.parity.ranks.sides.two_ranks import order_free

    torch.manual_seed(dist.get_rank())
    model = _Net()
    layout = _layout(model, dtype, **config)
    grads = [torch.randn_like(p) * 1e-3 for p in model.parameters()]
    factors = (None, 2.0) if config["engine"] == "fsdp2" else (2.0, None)
    calls, all_reduce = [0], dist.all_reduce

    def counted(*args, **kwargs):
        calls[0] += 1
        return all_reduce(*args, **kwargs)

    def refused(*args, **kwargs):
        raise AssertionError("only flat all-reduces where the order is free")

    collectives = ("all_gather_into_tensor", "reduce_scatter_tensor", "reduce_scatter_single")  # the last: 2.12+
    others = {name: getattr(dist, name) for name in collectives if hasattr(dist, name)}
    chunk_cat, limit = torch._chunk_cat, order_free.ONE_CALL_MB
    dist.all_reduce = counted
    for name in others:
        setattr(dist, name, refused)
    torch._chunk_cat = refused  # the candidate's layout: not needed where the order is free
    order_free.ONE_CALL_MB = limit if one_call_mb is None else one_call_mb
    try:
        once = reduce_layout.reduce(layout, list(model.parameters()), list(grads), dtype, factors)
    finally:
        dist.all_reduce = all_reduce
        for name, call in others.items():
            setattr(dist, name, call)
        torch._chunk_cat, order_free.ONE_CALL_MB = chunk_cat, limit
    reverse = reduce_layout.reduce(
        layout, list(model.parameters()), list(grads), dtype, factors, in_reverse=True
    )
    same = all(torch.equal(a.view(-1), b.view(-1)) for a, b in zip(once, reverse, strict=True))
    return same, calls[0]


@pytest.mark.parametrize("config", _ENGINES, ids=lambda c: f"{c['engine']}-{c.get('sharding', '')}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_at_two_ranks_every_bucket_goes_in_one_all_reduce_with_the_bits_of_any_order(ranks, config, dtype):
    """Two addends sum alike in any order: one call for the whole model gives the bits of each
    bucket summed the other way round."""
    assert ranks.run(_reduced_both_ways, config, dtype, world_size=2) == [(True, 1)] * 2


@pytest.mark.parametrize("config", _ENGINES, ids=lambda c: f"{c['engine']}-{c.get('sharding', '')}")
def test_at_two_ranks_a_large_model_goes_bucket_by_bucket_in_flat_all_reduces(ranks, config):
    """Too large for one buffer, the gradients travel a bucket at a time (the root's and each
    unit's: 3 calls), still flat all-reduces, not the candidate's chunked layout or a
    reduce-scatter and a gather: the bits of any order at a copy less."""
    found = ranks.run(_reduced_both_ways, config, torch.float32, 0.0, world_size=2)
    assert found == [(True, 3)] * 2


def _reduced_in_place(config: dict, consume: bool, dtype: torch.dtype) -> tuple[bool, bool, bool, int]:
    """On each of 2 ranks, every ``dtype`` gradient of ``_Net`` large enough to go alone (the limits
    set to 0 here), reduced in float32 with ``config``'s factors: whether the bits are those of the
    ranks summed in reverse order, whether each result is the very tensor given, whether the given
    tensors still hold this rank's own values, and how many all-reduces it took."""
    import torch.distributed as dist

    from harness.parity.ranks.sides.two_ranks import order_free

    torch.manual_seed(dist.get_rank())
    model = _Net()
    layout = _layout(model, **config)
    factors = (None, 2.0) if config["engine"] == "fsdp2" else (2.0, None)
    grads = [(torch.randn_like(p) * 1e-3).to(dtype) for p in model.parameters()]
    own = [g.clone() for g in grads]
    given = list(grads)
    params = list(model.parameters())
    reverse = reduce_layout.reduce(
        layout, params, [g.clone() for g in own], torch.float32, factors, in_reverse=True
    )
    calls, all_reduce = [0], dist.all_reduce

    def counted(*args, **kwargs):
        calls[0] += 1
        return all_reduce(*args, **kwargs)

    limits = order_free.ONE_CALL_MB, order_free.IN_PLACE_MB
    dist.all_reduce, order_free.ONE_CALL_MB, order_free.IN_PLACE_MB = counted, 0.0, 0.0
    try:
        out = reduce_layout.reduce(layout, params, grads, torch.float32, factors, consume=consume)
    finally:
        dist.all_reduce = all_reduce
        order_free.ONE_CALL_MB, order_free.IN_PLACE_MB = limits
    same = all(torch.equal(a, b) for a, b in zip(out, reverse, strict=True))
    where = all(a is b for a, b in zip(out, given, strict=True))
    kept = all(torch.equal(a, b) for a, b in zip(given, own, strict=True))
    return same, where, kept, calls[0]


@pytest.mark.parametrize("config", _ENGINES, ids=lambda c: f"{c['engine']}-{c.get('sharding', '')}")
def test_at_two_ranks_a_large_gradient_given_up_is_reduced_where_it_lies(ranks, config):
    """A gradient the caller gives up (``consume``), large enough to go alone, is all-reduced in
    its own tensor, divided before and after as its engine divides: no copy into a buffer and
    out, one call each (8 parameters), the same bits."""
    found = ranks.run(_reduced_in_place, config, True, torch.float32, world_size=2)
    assert found == [(True, True, False, 8)] * 2


@pytest.mark.parametrize("config", _ENGINES, ids=lambda c: f"{c['engine']}-{c.get('sharding', '')}")
def test_at_two_ranks_a_gradient_the_caller_keeps_is_not_reduced_in_place(ranks, config):
    """Without ``consume`` the caller's gradients keep their values: the reduction goes through a
    buffer of the bucket's own (3 buckets), the same bits."""
    found = ranks.run(_reduced_in_place, config, False, torch.float32, world_size=2)
    assert found == [(True, False, True, 3)] * 2


def test_at_two_ranks_a_low_precision_gradient_is_reduced_where_its_cast_lies(ranks):
    """A bfloat16 gradient reduced in float32 is cast into a copy anyway: that copy is reduced in
    place, one call each, even where the caller keeps its gradients, which keep their values."""
    found = ranks.run(_reduced_in_place, _ENGINES[1], False, torch.bfloat16, world_size=2)
    assert found == [(True, False, True, 8)] * 2
