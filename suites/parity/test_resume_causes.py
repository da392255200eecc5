"""Each known resume bug, planted into the candidate's restart on the ranks
(``fixtures/resume_plants.py``), fails its resume row at the first step after the resume and is
named by its cause; the user's own pair that forgets the scaler is named the same way."""

import pytest

from fixtures.resume_plants import planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import ParityConfig
from suites.parity.support import describe, ranks_executor

_AT = 3
_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True, "resume_at": _AT, "resume_method": "dcp"}
_FSDP1 = {
    "engine": "fsdp1",
    "sharding": "full_shard",
    "use_orig_params": False,
    "resume_at": _AT,
    "resume_method": "dcp",
}

_PLANTED = {
    "optimizer_not_restored": (
        ParityConfig.from_flat(optimizer="sgd", **_FSDP1),
        "resume_optimizer_not_restored",
    ),
    "step_counter_reset": (ParityConfig.from_flat(optimizer="adam", **_FSDP2), "resume_step_counter_reset"),
    "scaler_not_restored": (
        ParityConfig.from_flat(**_FSDP2, precision="fp16", init_scale=2.0**20),
        "resume_scaler_not_restored",
    ),
    "rng_not_restored": (ParityConfig.from_flat(workload="convnet", **_FSDP2), "resume_rng_not_restored"),
    "weights_late": (ParityConfig.from_flat(**_FSDP1), "resume_weights_late"),
    "scheduler_not_restored": (
        ParityConfig.from_flat(workload="fixtures.resume_workloads:scheduled", **_FSDP2),
        "resume_scheduler_not_restored",
    ),
    "shards_swapped": (
        ParityConfig.from_flat(**_FSDP1, resume_layout="fully_shard"),
        "resume_shard_misplaced",
    ),
}


@pytest.fixture(scope="module")
def planted(module_ranks):
    """``{bug: Outcome}``: each bug's row, run with the bug planted on the ranks."""
    found = {}
    for bug, (config, _) in _PLANTED.items():
        (found[bug],) = runner.run([config], planted_executor(module_ranks, bug), localize=False)
    return found


@pytest.mark.parametrize("bug", [bug for bug in _PLANTED if bug != "scheduler_not_restored"])
def test_a_planted_resume_bug_fails_at_the_first_step_after_the_resume(planted, bug):
    result = planted[bug].result
    assert result.status == "fail", describe(planted[bug])
    assert result.first_diverging_step == _AT


def test_a_scheduler_not_restored_fails_one_step_later(planted):
    """The restored optimizer holds the resumed step's learning rate; the fresh scheduler then sets
    the next step's from its own first epoch."""
    result = planted["scheduler_not_restored"].result
    assert result.status == "fail", describe(planted["scheduler_not_restored"])
    assert result.first_diverging_step == _AT + 1


@pytest.mark.parametrize("bug", list(_PLANTED))
def test_a_planted_resume_bug_is_named_first_by_its_cause(planted, bug):
    names = [c.name for c in planted[bug].result.causes]
    assert names[:1] == [_PLANTED[bug][1]], names


def test_the_cause_says_where_the_run_resumed_and_what_it_lost(planted):
    (cause,) = [c for c in planted["optimizer_not_restored"].result.causes if c.name.startswith("resume_")]
    assert f"resumed at step {_AT} from a checkpoint saved after step {_AT - 1}" in cause.evidence
    assert "the first step after resuming" in cause.evidence
    assert "momentum_buffer" in cause.evidence


def test_a_users_pair_that_forgets_the_scaler_fails_named_scaler_not_restored(module_ranks):
    config = ParityConfig.from_flat(
        workload="fixtures.resume_workloads:forgets_scaler",
        **{**_FSDP2, "resume_method": "user"},
        precision="fp16",
    )
    (outcome,) = runner.run([config], ranks_executor(module_ranks), localize=False)
    assert outcome.result.status == "fail", describe(outcome) + outcome.result.detail
    assert [c.name for c in outcome.result.causes][:1] == ["resume_scaler_not_restored"]
