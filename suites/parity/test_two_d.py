"""2-D layouts at world size 4: HSDP (``fully_shard`` on a replicate x shard mesh, 2 x 2 and 4 x 1)
and FSDP2 + tensor parallelism (dp 2 x tp 2, and tp 4) on the built-in Llama-style decoder and on
a residual MLP with biases pass bitwise, and each planted 2-D bug fails its row and is named.

Why bitwise and not a tolerance: HSDP's reference reduces through the candidate's two stages
(reduce-scatter over the shard group, all-reduce over the replicas) with divide factors derived on
its own side; the TP reference computes each TP'd linear as the plan splits it and sums the partial
products through the candidate's own collective, in the ring's order at any degree
(``ranks/sides/tp/mirror.py``). The plants live in
``fixtures/two_d_plants.py``. The whole 2-D matrix of the decoder is the ``two_d`` tier
(``make two-d``, ``test_two_d_tier.py``); ``make test`` runs one correct row and one plant of
this module, the ``two_d`` marker the rest.
"""

from __future__ import annotations

import pytest

from fixtures.two_d_plants import TwoDPlant, planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import Mesh, ParityConfig
from harness.parity.plan.matrices import two_d as two_d_matrix

_COMMON = {"engine": "fsdp2", "reshard_after_forward": True, "workload": "llama", "world_size": 4, "steps": 3}
SMOKE = ParityConfig.from_flat(optimizer="adamw", **_COMMON, tp=2, precision="bf16", recipe="reduce32")
SEQUENCE_SMOKE = ParityConfig.from_flat(
    **{**_COMMON, "workload": "fixtures.two_d_workloads:llama_sp"},
    optimizer="sgd",
    tp=2,
    precision="bf16",
)
"""torchtitan's sequence-parallel plan at tp 2 (each rank's partial gradients summed before the
ranks', ``tp/mirror._FanOut``): the ``two_d`` tier's; ``make test`` runs it at tp 4
(:data:`SEQUENCE_TP4`) beside Megatron's plan (:data:`SMOKE`)."""
SEQUENCE_TP4 = SEQUENCE_SMOKE.with_(mesh=Mesh(tp=4))
BIASED_TP4 = ParityConfig.from_flat(
    **{**_COMMON, "workload": "fixtures.user_workloads:biased_mlp"}, optimizer="sgd", tp=4, precision="bf16"
)
"""The tp 4 rows ``make test`` runs: torchtitan's sequence-parallel plan (reduce-scatters of four
addends, in the ring's order: ``tp/mirror._Reducer``) and row-split linears with biases."""
_LOSS_PARALLEL = {**_COMMON, "workload": "fixtures.two_d_workloads:llama_loss_parallel"}
LOSS_PARALLEL = ParityConfig.from_flat(**_LOSS_PARALLEL, optimizer="sgd", tp=2, precision="fp32")
"""The loss-parallel row ``make test`` runs: the untied head split by vocabulary, its logits a
sharded DTensor, the cross-entropy under ``loss_parallel()`` on both sides (the twin hands its loss
the same DTensor: ``tp/mirror._handed_on``)."""
CORRECT = [
    SMOKE,
    LOSS_PARALLEL,
    ParityConfig.from_flat(**_LOSS_PARALLEL, optimizer="adamw", tp=4, precision="fp16"),
    ParityConfig.from_flat(**_LOSS_PARALLEL, optimizer="adamw", tp=2, precision="bf16", recipe="reduce32"),
    SEQUENCE_SMOKE,
    SEQUENCE_TP4,
    BIASED_TP4,
    ParityConfig.from_flat(optimizer="adamw", **_COMMON, tp=4, precision="bf16", recipe="reduce32"),
    ParityConfig.from_flat(optimizer="adamw", **_COMMON, tp=4, precision="fp16"),
    ParityConfig.from_flat(
        **{**_COMMON, "workload": "fixtures.user_workloads:biased_mlp"},
        optimizer="adamw",
        tp=2,
        precision="fp16",
    ),
    ParityConfig.from_flat(
        **{**_COMMON, "workload": "fixtures.user_workloads:biased_mlp"},
        optimizer="adamw",
        tp=4,
        precision="fp32",
    ),
    ParityConfig.from_flat(optimizer="adamw", **_COMMON, hsdp=2, precision="bf16"),
    ParityConfig.from_flat(optimizer="sgd", **_COMMON, hsdp=4, precision="fp32"),
]
PLANTS = {
    "hsdp2x2_divides_by_the_shard_group": (
        ParityConfig.from_flat(optimizer="sgd", **_COMMON, hsdp=2),
        TwoDPlant(kind="hsdp_shard_divide_factor"),
        "divide_factor",
    ),
    "hsdp4x1_divides_by_the_shard_group": (
        ParityConfig.from_flat(optimizer="sgd", **_COMMON, hsdp=4, precision="bf16"),
        TwoDPlant(kind="hsdp_shard_divide_factor"),
        "divide_factor",
    ),
    "tp_partial_not_reduced": (
        ParityConfig.from_flat(optimizer="sgd", **_COMMON, tp=2),
        TwoDPlant(kind="tp_partial_not_reduced"),
        "tp_partial_not_reduced",
    ),
    "tp_module_left_out": (
        ParityConfig.from_flat(optimizer="sgd", **_COMMON, tp=2, precision="bf16"),
        TwoDPlant(kind="tp_module_left_out", module="layers.*.ffn.up"),
        "tp_plan_incomplete",
    ),
    "sp_norm_left_out": (
        ParityConfig.from_flat(
            **{**_COMMON, "workload": "fixtures.two_d_workloads:llama_sp_norm_left_out"},
            optimizer="sgd",
            tp=2,
        ),
        TwoDPlant(kind="none"),
        "tp_grad_not_reduced",
    ),
    "tp4_partial_over_half_the_group": (
        ParityConfig.from_flat(optimizer="sgd", **_COMMON, tp=4),
        TwoDPlant(kind="tp_partial_over_half_the_group"),
        "tp_partial_not_reduced",
    ),
    "tp4_reference_sums_in_order": (
        ParityConfig.from_flat(optimizer="sgd", **_COMMON, tp=4),
        TwoDPlant(kind="reference_sums_in_order"),
        None,
    ),
    "reference_without_tp_split": (
        ParityConfig.from_flat(optimizer="sgd", **_COMMON, tp=2),
        TwoDPlant(kind="reference_without_tp_split"),
        None,
    ),
}
_FAST_PLANT = "hsdp2x2_divides_by_the_shard_group"
"""The plant ``make test`` runs (a second and a half; the others are the ``two_d`` tier's)."""


def _tiered(values, *fast):
    return [v if v in fast else pytest.param(v, marks=pytest.mark.two_d) for v in values]


@pytest.mark.parametrize(
    "config",
    _tiered(CORRECT, SMOKE, SEQUENCE_TP4, BIASED_TP4, LOSS_PARALLEL),
    ids=lambda c: c.id,
)
def test_a_correct_2d_row_passes_bitwise_at_world_size_4(module_ranks, config):
    (outcome,) = runner.run([config], planted_executor(module_ranks, TwoDPlant(kind="none")))
    result = outcome.result
    assert (result.status, result.profile, result.closeness) == ("pass", "exact", "bitwise"), result.reason


@pytest.mark.parametrize("case", _tiered(sorted(PLANTS), _FAST_PLANT))
def test_a_planted_2d_bug_fails_its_row_and_is_named(module_ranks, case):
    config, plant, cause = PLANTS[case]
    (outcome,) = runner.run([config], planted_executor(module_ranks, plant))
    result = outcome.result
    # A plan that leaves out a module the model's code needs split cannot run: a shape mismatch
    # in the candidate (a red ``crash`` row), named from its error.
    red = "crash" if plant.kind == "tp_module_left_out" else "fail"
    assert result.status == red, f"{case}: {result.status} {result.reason}"
    assert result.first_diverging_step == 0, result.reason
    if cause is not None:
        assert cause in [c.name for c in result.causes], (
            case,
            [c.name for c in result.causes],
            result.reason,
        )
    if config.mesh.hsdp is not None:  # said in HSDP's terms: the replicas summed, not averaged
        (named,) = [c for c in result.causes if c.name == "divide_factor"]
        assert f"{config.mesh.hsdp}x the reference's were summed across the replicas" in named.explanation


def test_the_2d_matrix_has_hsdp_at_both_sharding_degrees_and_tp_in_every_recipe_and_optimizer():
    ids = [c.id for c in two_d_matrix.rows("llama", world_size=4)]
    assert {"hsdp2x2", "hsdp4x1", "tp2"} <= {part for i in ids for part in i.split("-")}
    tp_rows = [c for c in two_d_matrix.rows("llama", world_size=4) if c.mesh.tp == 2 and not c.faults]
    assert {(c.recipe_name, c.optimizer) for c in tp_rows} == {
        (r, o) for r in ("fp32", "pure-bf16", "bf16-reduce32", "pure-fp16") for o in ("sgd", "adamw")
    }
    assert two_d_matrix.rows("llama", world_size=2) == []


@pytest.mark.two_d
def test_a_users_function_under_loss_parallel_passes_bitwise(module_ranks):
    """The same plan applied by the user's own ``parallelize``: the twin reads the head's style off
    what the function did and hands its loss the same sharded logits."""
    from harness.parity.doors.testing import ranks_executor
    from harness.parity.plan.matrices import workload as workload_matrix

    configs = workload_matrix.for_workload(
        "fixtures.two_d_workloads:llama_loss_parallel_function", world_size=4, mesh="dp=2,tp=2"
    )
    for outcome in runner.run(configs, ranks_executor(module_ranks)):
        result = outcome.result
        assert (result.status, result.closeness) == ("pass", "bitwise"), (result.config.id, result.reason)
