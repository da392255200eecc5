"""The candidate's gradient buffers as the reference lays them out (``ranks/sides/reduce_layout.py``):
which parameters share a collective, in which order, with which alignment. Pure: no ranks (the
reduction itself is checked bitwise at world size 4 in ``test_world_size.py``)."""

from __future__ import annotations

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
