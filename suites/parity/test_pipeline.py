"""Pipeline rows (FSDP2 + PP under torch's schedules) pass bitwise against the whole model's twin
over the same microbatches, and each classic PP bug planted into the candidate fails its row at
step 0 and is named.

Why bitwise: every stage adds its microbatches' gradients in the order the twin back-propagates
them (``stages.backward_order``), FSDP2 reduces the sum once per stage bucket over the stage's
dp ranks and the schedule divides it by the count, which the twin mirrors
(``ranks/sides/pipeline/twin.py``); tied copies are summed across stages as two addends, alike
in any order. The plants live in ``fixtures/pipeline_plants.py``. ``make test`` runs one row of
two schedules at world size 2 and one plant; the ``pipeline`` tier the rest, at
world sizes 2 (pp 2), 4 (pp 2 x dp 2, pp 2 x tp 2) and 8 (pp 2 x dp 2 x tp 2).
"""

from __future__ import annotations

import pytest

from fixtures.pipeline_plants import PipelinePlant, planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import ParityConfig

_COMMON = {
    "engine": "fsdp2",
    "workload": "llama",
    "world_size": 2,
    "steps": 3,
    "reshard_after_forward": False,
}


def _row(schedule: str, **changes: object) -> ParityConfig:
    fields = {**_COMMON, "optimizer": "adamw", "pp": 2, "schedule": schedule, "microbatches": 4, **changes}
    return ParityConfig.from_flat(**fields)


SMOKE = (
    _row("1f1b", precision="bf16"),
    _row("looped_bfs", precision="fp16", init_scale=256.0),
    _row("zbv", precision="bf16", recipe="reduce32"),
)
"""The rows ``make test`` runs: a schedule with a stage per rank, one with two whose stages add
their microbatches last first, and one that splits the backward with a float32 reduce dtype over
bf16 parameters (some microbatches summed in bf16 first: ``sides/pipeline/halves.py``)."""
CORRECT = [
    *SMOKE,
    _row("gpipe", precision="fp32"),
    _row("interleaved1f1b", precision="bf16", recipe="reduce32"),
    _row("interleaved_zb", precision="fp16", init_scale=256.0),
    _row("interleaved_zb", precision="bf16", recipe="reduce32"),
    _row("dualpipev", precision="bf16", recipe="reduce32", world_size=4),
    _row("zbv", precision="bf16"),
    _row("dualpipev", precision="fp32"),
    _row("1f1b", precision="bf16", recipe="reduce32", world_size=4),
    _row("zbv", precision="fp16", init_scale=256.0, world_size=4),
    _row("gpipe", precision="bf16", world_size=4, reshard_after_forward=True),
    _row("looped_bfs", precision="fp32", world_size=4, optimizer="sgd"),
    _row("1f1b", precision="bf16", world_size=4, tp=2),
    _row("zbv", precision="fp16", init_scale=256.0, world_size=4, tp=2),
    _row("interleaved1f1b", precision="bf16", recipe="reduce32", world_size=8, tp=2),
    _row("gpipe", precision="fp32", world_size=8, tp=2, optimizer="sgd"),
]
"""Every schedule kind, both layouts and every recipe at pp 2 (world size 2), pp 2 x dp 2 (4), pp 2 x
tp 2 (4) and pp 2 x dp 2 x tp 2 (8)."""
PLANTS = {
    "tie_not_summed": (_row("1f1b", optimizer="sgd"), "pp_tie_not_summed"),
    "loss_not_divided": (_row("gpipe", optimizer="sgd"), "pp_microbatch_scaling"),
    "loss_divided_twice": (_row("interleaved1f1b", optimizer="sgd"), "pp_microbatch_scaling"),
    "param_not_in_optimizer": (_row("1f1b", optimizer="sgd"), "pp_param_not_stepped"),
    "microbatch_order": (_row("gpipe", optimizer="sgd"), "pp_stage_inputs_differ"),
    "tie_not_summed_3d": (_row("1f1b", optimizer="sgd", world_size=8, tp=2), "pp_tie_not_summed"),
    "param_not_in_optimizer_3d": (_row("1f1b", optimizer="sgd", world_size=8, tp=2), "pp_param_not_stepped"),
    "tp_param_not_in_optimizer_3d": (
        _row("gpipe", optimizer="sgd", world_size=8, tp=2),
        "pp_param_not_stepped",
    ),
}
"""Each plant at pp 2, and (``_3d``) at pp 2 x dp 2 x tp 2: a replicated norm's shards and (``tp_``) a
column-split linear of the last stage, each compared by the stage that holds it."""
_FAST_PLANT = "param_not_in_optimizer"
TORCH_DEFECT = _row("zbv", optimizer="sgd", reshard_after_forward=True)
"""A row torch 2.13 gets wrong: ZBV with FSDP2 resharding after forward (``make pipeline`` leaves
the others out)."""
"""The plant ``make test`` runs: a bug on the last stage only, which its own ranks must compare."""


def _tiered(values, *fast):
    return [v if v in fast else pytest.param(v, marks=pytest.mark.pipeline) for v in values]


@pytest.mark.parametrize("config", _tiered(CORRECT, *SMOKE), ids=lambda c: c.id)
def test_a_correct_pipeline_row_passes_bitwise(module_ranks, config):
    (outcome,) = runner.run([config], planted_executor(module_ranks, PipelinePlant(kind="none")))
    result = outcome.result
    assert (result.status, result.profile, result.closeness) == ("pass", "exact", "bitwise"), result.reason


@pytest.mark.parametrize("case", _tiered(sorted(PLANTS), _FAST_PLANT))
def test_a_planted_pipeline_bug_fails_at_step_0_and_is_named(module_ranks, case):
    config, cause = PLANTS[case]
    kind = case.removesuffix("_3d").removeprefix("tp_")
    plant = PipelinePlant(
        kind=kind, module="layers.1.attention.q.weight" if case.startswith("tp_") else "norm.weight"
    )
    (outcome,) = runner.run([config], planted_executor(module_ranks, plant))
    result = outcome.result
    assert result.status == "fail", f"{case}: {result.status} {result.reason}"
    assert result.first_diverging_step == 0, result.reason
    assert cause in [c.name for c in result.causes], (case, [c.name for c in result.causes], result.reason)


@pytest.mark.pipeline
@pytest.mark.parametrize(
    ("workload", "status", "cause"),
    [
        ("fixtures.semantic_workloads:tokens_mean_piped", "fail", "loss_normalization"),
        ("fixtures.semantic_workloads:tokens_equal_piped", "pass", None),
    ],
)
def test_the_ground_truth_judges_the_microbatches_a_schedule_cuts(module_ranks, workload, status, cause):
    """A mean over each microbatch's own tokens, averaged by the schedule, weighs tokens unequally
    when the counts differ: the twin shares it (the row passes), the whole batch does not."""
    config = _row("gpipe", optimizer="sgd", workload=workload)
    from harness.parity.doors.testing import ranks_executor

    (outcome,) = runner.run([config], ranks_executor(module_ranks), ground_truth=True)
    assert outcome.result.status == "pass", outcome.result.reason
    found = outcome.result.semantics
    assert found is not None and found.status == status, found
    assert "4 microbatches cut from each batch" in found.split
    assert (found.cause.name if found.cause is not None else None) == cause


@pytest.mark.pipeline
def test_a_split_backward_schedule_resharding_after_forward_fails_as_expected_and_is_named(module_ranks):
    (outcome,) = runner.run([TORCH_DEFECT], planted_executor(module_ranks, PipelinePlant(kind="none")))
    result = outcome.result
    assert result.status == "fail" and result.first_diverging_step == 0, result.reason
    assert "loses microbatches from weight gradients" in result.expected_failure
    assert "pp_zero_bubble_resharded" in [c.name for c in result.causes]
