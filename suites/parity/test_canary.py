"""The wiring canary: its gradients sum exactly in any order, so it is judged bitwise on every
backend, and a wiring bug fails it with no tolerance at all.

Why a property of the workload and not only of a run: the canary is what stands where the
reference cannot sum in its candidate's order (NCCL); its claim, "every sum over up to 8 ranks is
exact in any order", is checked here directly on every rank's gradients, step by step.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from fixtures.parity_plants import Plant, planted_executor
from harness.parity.doors import runner
from harness.parity.plan import profiles
from harness.parity.plan.config import Layout, ParityConfig
from harness.parity.plan.matrices import default as matrix
from harness.parity.workload import registry
from suites.parity.support import ranks_executor


def _local_grads(world: int) -> list[list[dict[str, torch.Tensor]]]:
    """Per step, each rank's local float32 gradients of the canary, trained on the exact mean of
    them (float64, then float32: exact when the property holds)."""
    workload = registry.get("canary")
    model = registry.build_model(workload, 0)
    optimizer = workload.optimizer([p for p in model.parameters()])
    steps = []
    for step in range(workload.steps):
        per_rank = []
        for rank in range(world):
            model.zero_grad(set_to_none=True)
            with registry.seeded(registry.forward_seed(0, rank, step), torch.device("cpu")):
                workload.loss(model, registry.make_batch(workload, 0, rank, step)).backward()
            per_rank.append({n: p.grad.clone() for n, p in model.named_parameters()})
        steps.append(per_rank)
        for name, param in model.named_parameters():
            total = sum(g[name].double() for g in per_rank) / world
            param.grad = total.float()
        optimizer.step()
    return steps


@pytest.mark.parametrize("world", [4, 8])
def test_every_gradient_of_the_canary_sums_exactly_in_any_order(world):
    for per_rank in _local_grads(world):
        for name in per_rank[0]:
            exact = sum(g[name].double() for g in per_rank)
            assert torch.equal(exact.float().double(), exact), name  # float32 holds the exact sum
            for order in itertools.islice(itertools.permutations(range(world)), 0, None, 997):
                total = torch.zeros_like(per_rank[0][name])
                for rank in order:
                    total = total + per_rank[rank][name]
                assert torch.equal(total.double(), exact), (name, order)


def test_the_canary_is_judged_bitwise_on_every_backend():
    for backend in ("gloo", "nccl"):
        config = ParityConfig(
            engine="fsdp2", workload="canary", backend=backend, layout=Layout(reshard_after_forward=True)
        )
        assert profiles.profile_for(config).name == "exact"


CANARY_ROWS = matrix.canary(world_size=4)
SAMPLE = ("fsdp1-hybrid_shard-orig-fp32-own-canary-w4", "fsdp2-reshard-fp32-own-canary-w4")
"""The canary's rows at world size 4 that ``make test`` runs: HYBRID_SHARD's two stages and FSDP2's
chunked reduce-scatter. The others (DDP's buckets, FSDP1 FULL_SHARD flat and original, NO_SHARD)
are the ``world_sizes`` tier's, whose ``make world-sizes`` also runs every canary row at world
size 4 through the default matrix; ``test_world_size.py`` holds each of those layouts bitwise at
world size 4 in ``make test``, on workloads whose sums do depend on the order."""


def _bitwise(module_ranks, rows: list[ParityConfig]) -> dict[str, object]:
    return {o.result.config.id: o.result for o in runner.run(rows, ranks_executor(module_ranks))}


@pytest.fixture(scope="module")
def canary_at_4(module_ranks):
    """``{config id: ParityResult}`` of :data:`SAMPLE`."""
    return _bitwise(module_ranks, [c for c in CANARY_ROWS if c.id in SAMPLE])


@pytest.fixture(scope="module")
def canary_rest_at_4(module_ranks):
    """``{config id: ParityResult}`` of the canary's other rows at world size 4 (``world_sizes``)."""
    return _bitwise(module_ranks, [c for c in CANARY_ROWS if c.id not in SAMPLE])


def test_the_sample_is_rows_of_the_canary():
    assert set(SAMPLE) <= {c.id for c in CANARY_ROWS}, SAMPLE


_ROWS = [
    pytest.param("canary_at_4", c, id=c.id)
    if c.id in SAMPLE
    else pytest.param("canary_rest_at_4", c, id=c.id, marks=pytest.mark.world_sizes)
    for c in CANARY_ROWS
]


@pytest.mark.parametrize(("found", "config"), _ROWS)
def test_the_canary_passes_bitwise_under_every_layout_at_world_size_4(request, found, config):
    result = request.getfixturevalue(found)[config.id]
    assert (result.status, result.closeness) == ("pass", "bitwise"), result.reason


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        (Plant(kind="grad_factor", amount=4 / 3), "divide_factor"),
        (Plant(kind="rank_left_out"), "reduction_differs"),
    ],
    ids=["divide_off_by_one_rank", "rank_left_out"],
)
def test_a_wiring_bug_fails_the_canary_at_world_size_4(module_ranks, plant, named):
    config = ParityConfig(
        engine="fsdp2",
        workload="canary",
        optimizer="own",
        world_size=4,
        layout=Layout(reshard_after_forward=True),
    )
    (outcome,) = runner.run([config], planted_executor(module_ranks, plant))
    result = outcome.result
    assert result.status == "fail" and result.first_diverging_step == 0, result.reason
    assert named in [cause.name for cause in result.causes], result.causes
