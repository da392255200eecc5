"""Resharded resume rows: saved at one world size, loaded at another (4 -> 2, 2 -> 4), against a
reference that changes world size with its candidate at the same step from exactly the state it
reached; FSDP1 and FSDP2, DCP and (FSDP2) the name-keyed ShardedOptimizer method, float32 with
Adam and fp16 through the scaler, every row bitwise on gloo. A shard loaded into the next rank's
place at the new world size fails its row and is named.

The whole resharded matrix is its own tier (``-m reshard``, ``make reshard``; also marked
``world_sizes``, so ``make test`` leaves it out); ``make test`` runs one correct row and the plant.
"""

import pytest
import torch

from fixtures.resume_plants import planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import ParityConfig, resume
from harness.parity.plan.matrices import default as matrix
from harness.parity.ranks.restart import reshard
from suites.parity.support import cli_in_process, describe, ranks_executor

_AT = 3
_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True}
_FSDP1 = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": False}
_SOPT_4TO2 = ParityConfig.from_flat(
    optimizer="adam",
    world_size=4,
    **_FSDP2,
    resume_at=_AT,
    resume_method="sharded_optimizer",
    resume_world_size=2,
)


def _dcp(world_size: int, resumed: int, **layout: object) -> ParityConfig:
    return ParityConfig.from_flat(
        world_size=world_size, **layout, resume_at=_AT, resume_method="dcp", resume_world_size=resumed
    )  # type: ignore[arg-type]


def test_a_resharded_row_names_both_world_sizes_in_its_id_and_keywords():
    assert _SOPT_4TO2.id == "fsdp2-reshard-fp32-adam-resume@3-sopt-w4to2"
    assert {"resharded", "4to2", "resume"} <= _SOPT_4TO2.keywords


def test_its_second_half_runs_as_the_same_row_at_the_world_size_it_resumes_at():
    landed = resume.landing(_SOPT_4TO2)
    assert (landed.world_size, landed.resume.world_size, landed.resume.at) == (2, None, _AT)
    assert landed.reference_key() != _SOPT_4TO2.reference_key()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"resume_world_size": 4}, "must be a world size other than world_size=4"),
        ({"resume_world_size": 0}, "must be a world size other than"),
        ({"resume_at": None, "resume_method": None}, "resume_world_size=2 needs resume_at"),
        ({"resume_method": "dcp", "resume_layout": "fully_shard_keep"}, "change one thing each"),
        ({**_FSDP1, "reshard_after_forward": None}, "needs engine='fsdp2'"),
    ],
)
def test_a_reshard_the_engine_cannot_check_is_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        _SOPT_4TO2.with_(**changes)


def test_the_reshard_matrix_covers_both_directions_engines_methods_and_recipes():
    rows = matrix.reshard()
    assert {(c.world_size, c.resume.world_size) for c in rows} == {(4, 2), (2, 4)}
    assert {(c.engine, c.resume.method) for c in rows} == {
        ("fsdp1", "dcp"),
        ("fsdp2", "dcp"),
        ("fsdp2", "sharded_optimizer"),
    }
    assert {(c.precision.dtype, c.optimizer) for c in rows} == {("fp32", "adam"), ("fp16", "sgd")}
    assert not [c for c in matrix.default_matrix() if c.resume.world_size is not None]


def test_the_cli_lists_the_resharded_rows():
    done = cli_in_process("--reshard", "--list", "-k", "4to2")
    assert done.returncode == 0, done.stderr
    assert sum(line.endswith("-w4to2") for line in done.stdout.splitlines()) == 6


def test_the_cli_refuses_reshard_with_a_workload():
    done = cli_in_process("--reshard", "--workload", "mlp", "--list")
    assert done.returncode == 2 and "--reshard runs the embedded resharded rows" in done.stderr


def test_the_whole_tensor_audit_tells_misplaced_values_from_lost_ones():
    saved = {
        "params": {"w": torch.arange(6.0).reshape(3, 2), "b": torch.ones(3)},
        "state": {"w": {"exp_avg": torch.arange(6.0).reshape(3, 2), "step": torch.tensor(3.0)}},
    }
    rows_swapped = torch.arange(6.0).reshape(3, 2)[[1, 0, 2]]
    found = reshard.whole_audit(
        saved,
        {"w": rows_swapped, "b": torch.zeros(3)},
        {"w": {"exp_avg": torch.zeros(3, 2), "step": torch.tensor(0.0)}},
    )
    assert found == {
        "misplaced": ["w"],
        "weights": ["b"],
        "optimizer": ["w:exp_avg"],
        "optimizer_step": ["w:step"],
    }
    assert reshard.whole_audit(saved, saved["params"], saved["state"]) == {}


def test_a_rank_the_saving_world_lacked_reads_rank_0s_loop_state_but_not_its_rng():
    assert reshard.loop_file(1, 2) == (1, True)
    assert reshard.loop_file(3, 2) == (0, False)


_PLANTED = {
    "fsdp1_4to2": _dcp(4, 2, **_FSDP1),
    "fsdp2_2to4": _dcp(2, 4, optimizer="adam", **_FSDP2),
}


@pytest.fixture(scope="module")
def correct(module_ranks):
    (outcome,) = runner.run([_SOPT_4TO2], ranks_executor(module_ranks))
    return outcome


@pytest.fixture(scope="module")
def planted(module_ranks):
    """``{name: Outcome}``: each row of :data:`_PLANTED` with ``shard_from_next_rank`` planted."""
    execute = planted_executor(module_ranks, "shard_from_next_rank")
    outcomes = runner.run(list(_PLANTED.values()), execute, localize=False)
    return dict(zip(_PLANTED, outcomes, strict=True))


def test_a_row_resumed_at_another_world_size_trains_bitwise_like_its_reference(correct):
    assert correct.passed, describe(correct)
    assert correct.result.closeness == "bitwise"
    losses = correct.result.curves["candidate"].loss
    assert [len(by_rank) for by_rank in losses] == [4, 4, 4, 2, 2, 2]


def test_the_resharded_load_audits_whole_tensors_and_finds_everything_restored(correct):
    step = correct.candidate.steps[_AT]
    assert [audit.restored for audit in step.resume] == [{}, {}]
    assert {audit.world_sizes for audit in step.resume} == {(4, 2)}


@pytest.mark.parametrize("name", sorted(_PLANTED))
def test_a_shard_loaded_into_the_next_ranks_place_fails_and_is_named(planted, name):
    outcome = planted[name]
    assert outcome.result.status == "fail", describe(outcome)
    assert outcome.result.first_diverging_step == _AT
    named = [cause for cause in outcome.result.causes if cause.name == "resume_shard_misplaced"]
    assert named, describe(outcome)
    config = _PLANTED[name]
    sizes = (
        f"at world size {config.resume.world_size} from a checkpoint saved at world size {config.world_size}"
    )
    assert sizes in named[0].evidence


@pytest.fixture(scope="module")
def tier(module_ranks):
    """``{id: Outcome}`` of the whole resharded matrix."""
    return {o.result.config.id: o for o in runner.run(matrix.reshard(), ranks_executor(module_ranks))}


@pytest.mark.world_sizes
@pytest.mark.reshard
@pytest.mark.parametrize("config", matrix.reshard(), ids=lambda c: c.id)
def test_every_resharded_row_is_bitwise_on_gloo(tier, config):
    outcome = tier[config.id]
    assert outcome.passed, describe(outcome)
    assert (outcome.result.profile, outcome.result.closeness) == ("exact", "bitwise")
    assert [audit.restored for audit in outcome.candidate.steps[config.resume.at].resume] == [
        {}
    ] * config.resume.world_size  # type: ignore[operator]


@pytest.mark.world_sizes
@pytest.mark.reshard
def test_the_fp16_rows_skip_steps_through_the_scaler_on_both_sides_of_the_resume(tier):
    """The restored scale matters: fp16 starting at 2**20 skips its first steps before the save
    and, at another world size, steps after the load too; the reference skips the same ones."""
    skipped = {c.id: tier[c.id].result.skipped_steps for c in matrix.reshard() if c.precision.dtype == "fp16"}
    assert all(steps for steps in skipped.values()), skipped
