"""The low-precision reference divides its gradient sum as its candidate does, so an fp16 sum that
overflows under FSDP overflows in the reference too.

Why: FSDP splits the world size into a power of two divided before the reduction and the rest after
it (at world size 4: 2 and 2; FSDP2 only where the reduce dtype is float16), where DDP divides by
the whole world size first. Each division is exact, but at world size 4 a float16 sum of halves
overflows where one of quarters does not: before the reference used FSDP's factors, every fp16 row
of ``five_classes`` failed at step 0 with an infinity in ``emb.weight``'s gradient on the
candidate's side only, a difference of the reference, not of FSDP.
"""

import pytest
import torch
from torch.distributed.algorithms._comm_hooks.default_hooks import DefaultState
from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors

from harness.parity.doors import runner
from harness.parity.plan.config import Layout, ParityConfig, Precision
from harness.parity.ranks.sides import twin
from suites.parity.support import describe, ranks_executor

WORKLOAD = "fixtures.user_workloads:five_classes"
CONFIGS = [
    ParityConfig(
        engine="fsdp1",
        workload=WORKLOAD,
        world_size=4,
        layout=Layout(sharding="full_shard", use_orig_params=False),
        precision=Precision(dtype="fp16"),
    ),
    ParityConfig(
        engine="fsdp2",
        workload=WORKLOAD,
        world_size=4,
        layout=Layout(reshard_after_forward=True),
        precision=Precision(dtype="fp16"),
    ),
]


class _Group:
    """A stand-in process group for torch's factor helper, which asks only its size."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 8, 16])
@pytest.mark.parametrize("reduce", [torch.float32, torch.bfloat16, torch.float16])
def test_divide_factors_are_the_candidates_own(world, reduce):
    """The twin's factors are torch 2.13's: FSDP1's ``DefaultState`` split for every dtype, FSDP2's
    ``_get_gradient_divide_factors`` (``ReduceOp.AVG``, a division after the sum, where it does not
    fear overflow), DDP's whole world size before the sum."""
    pre = DefaultState._get_gradient_predivide_factor(world)
    assert twin.divide_factors("fsdp1", reduce, world) == (pre, world / pre)
    fsdp2_pre, fsdp2_post, op, _ = _get_gradient_divide_factors(_Group(world), None, reduce)
    if fsdp2_pre is None and fsdp2_post is None:  # ReduceOp.AVG: sum, then divide by the world size
        assert op in (torch.distributed.ReduceOp.AVG, torch.distributed.ReduceOp.SUM)
        assert twin.divide_factors("fsdp2", reduce, world) == (None, float(world))
    else:
        assert twin.divide_factors("fsdp2", reduce, world) == (fsdp2_pre, fsdp2_post)
    assert twin.divide_factors("ddp", reduce, world) == (float(world), None)


def test_fp16_on_four_ranks_overflows_in_the_reference_where_fsdp_does(module_ranks):
    """``five_classes`` in fp16 at world size 4 passes under FSDP1 and FSDP2, both sides skipping
    step 0: the infinity FSDP's sum of halves makes is the reference's too. Bitwise, not only a
    pass: a reference dividing as DDP does is values apart from its correct candidate, and the
    staged check, which holds the candidate to the exact mean, would still pass the row."""
    outcomes = runner.run(CONFIGS, ranks_executor(module_ranks), batch_size=len(CONFIGS), localize=False)
    for found in outcomes:
        assert found.result.status == "pass", describe(found)
        assert found.result.closeness == "bitwise", (found.result.closeness, found.result.max_ulp)
        assert 0 in found.result.skipped_steps, found.result.skipped_steps
        assert 0 in found.result.reference_skipped_steps, found.result.reference_skipped_steps


_FSDP2_4 = {"engine": "fsdp2", "reshard_after_forward": True, "workload": "llama", "world_size": 4}
_LAYOUTS_2D = {
    "tp2": ({"tp": 2}, 2),
    "hsdp2x2": ({"hsdp": 2}, 4),
    "hsdp4x1": ({"hsdp": 4}, 4),
}
"""A 2-D layout's fields, and over how many ranks its gradients are averaged: under TP the ``dp``
group's (not the world's: a TP group shares one batch), under HSDP both mesh dimensions' (not the
shard group's: pytorch#155903, nor the replicas')."""
_PRECISIONS = {"fp32": {}, "bf16": {"precision": "bf16"}, "fp16": {"precision": "fp16"}}
"""float32 (``MirroredDDP``), and the low-precision twin averaging (bf16) or splitting its factor
around the sum (fp16)."""


def _factors_asked(config: ParityConfig, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The divide factors the reference of ``config`` hands its reduction after a backward, its
    collectives replaced by a recorder. Built without ``__init__`` (which wraps in DDP, a process
    group this controller-side test has not): ``after_backward`` reads only what is set here."""
    from torch import nn

    from harness.parity.ranks.sides import reduce_layout, references

    asked: list[tuple] = []
    module = nn.Linear(2, 2)
    for param in module.parameters():
        param.grad = torch.ones_like(param)
    if config.policy is None:
        reference = references.MirroredDDP.__new__(references.MirroredDDP)
        reference._phase = (0, config.engine, "the candidate's layout")
        monkeypatch.setattr(
            reduce_layout,
            "reduce",
            lambda layout, params, grads, dtype, factors, **_: asked.append(factors) or grads,
        )
    else:
        reference = references.LowPrecisionDDP.__new__(references.LowPrecisionDDP)
        reference.policy, reference.working, reference.layout = (
            config.policy,
            module,
            "the candidate's layout",
        )
        monkeypatch.setattr(
            twin, "reduce_grads", lambda lows, masters, policy, factors, layout, **_: asked.append(factors)
        )
    reference.config, reference.module, reference.summed_in_reverse = config, module, False
    reference.after_backward()
    return asked


@pytest.mark.parametrize("precision", list(_PRECISIONS))
@pytest.mark.parametrize("layout", list(_LAYOUTS_2D))
def test_each_reference_divides_over_its_candidates_data_parallel_group_on_a_2d_mesh(
    layout, precision, monkeypatch
):
    """The float32 reference and the low-precision twin, under TP and HSDP, each derive their
    candidate's factors from the ranks its gradients are averaged over: a factor taken over the
    whole world under TP halves every gradient, one over HSDP's shard group doubles it, which is
    the bug the reference must show in a candidate rather than share. The TP twin is either of
    them with the plan's split linears (``roles.build``), so its factors are these."""
    fields, ranks = _LAYOUTS_2D[layout]
    config = ParityConfig.from_flat(**_FSDP2_4, **fields, **_PRECISIONS[precision])
    assert (config.policy is None) == (precision == "fp32")
    reduce = torch.float16 if precision == "fp16" else torch.float32
    assert _factors_asked(config, monkeypatch) == [twin.divide_factors("fsdp2", reduce, ranks)]


@pytest.mark.parametrize(
    ("fields", "factors"),
    [
        ({"engine": "fsdp1", "sharding": "hybrid_shard", "use_orig_params": True}, (2.0, 2.0)),
        ({"engine": "fsdp2", "reshard_after_forward": True, "precision": "fp16"}, (2.0, 2.0)),
        ({"engine": "fsdp2", "reshard_after_forward": True}, (None, 4.0)),
    ],
    ids=["fsdp1-hybrid_shard", "fsdp2-fp16", "fsdp2-fp32"],
)
def test_the_hand_accumulation_divides_over_every_rank_of_its_candidate(fields, factors):
    """The reference's hand accumulation (``accumulate.HandAccumulation``) divides each reduction
    as its candidate does, over every data-parallel rank: FSDP1's HYBRID_SHARD counts both of its
    mesh dimensions (4 ranks: 2 before the sum, 2 after), not its shard group's 2. (Accumulation
    never runs on a 2-D mesh of FSDP2: ``test_two_d_plan`` checks the refusal.)"""
    from types import SimpleNamespace

    from torch import nn

    from harness.parity.ranks.sides import accumulate

    config = ParityConfig.from_flat(**fields, world_size=4, accumulate=2)
    engine = SimpleNamespace(
        module=nn.Linear(2, 2),
        candidate_layout=lambda: None,
        world_size=4,
        data_parallel_size=4,
        summed_in_reverse=False,
    )
    assert accumulate.HandAccumulation(config, engine).factors == factors
