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
    step 0: the infinity FSDP's sum of halves makes is the reference's too."""
    outcomes = runner.run(CONFIGS, ranks_executor(module_ranks), batch_size=len(CONFIGS), localize=False)
    for found in outcomes:
        assert found.result.status == "pass", describe(found)
        assert 0 in found.result.skipped_steps, found.result.skipped_steps
        assert 0 in found.result.reference_skipped_steps, found.result.reference_skipped_steps
