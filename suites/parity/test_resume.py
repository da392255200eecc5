"""Resume rows: the candidate saves, drops everything, loads into a fresh model with new random
weights and trains on; FSDP1 and FSDP2, both of our checkpoint methods, float32 and fp16 through
the scaler, the user's own pair, and a row that comes back in another layout (FSDP1 -> FSDP2)
train bitwise like the run straight through."""

import pytest

from harness.parity.doors import runner
from harness.parity.plan.config import Layout, ParityConfig, Precision, Resume, Scale
from harness.parity.plan.matrices import default as matrix
from harness.parity.plan.matrices import resume as resume_matrix
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from harness.parity.ranks.restart import resume
from harness.parity.workload.spec import WorkloadError
from suites.parity.support import cli_in_process, describe, ranks_executor

_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True}
_ROWS = {
    "fsdp1_dcp_adam": ParityConfig(
        engine="fsdp1",
        optimizer="adam",
        layout=Layout(sharding="full_shard", use_orig_params=False),
        resume=Resume(at=3, method="dcp"),
    ),
    "fsdp2_sopt_fp16": ParityConfig.from_flat(
        **_FSDP2,
        precision="fp16",
        init_scale=2.0**20,
        resume_at=3,
        resume_method="sharded_optimizer",
    ),
    "fsdp1_sopt_fp16": ParityConfig(
        engine="fsdp1",
        layout=Layout(sharding="full_shard", use_orig_params=False),
        precision=Precision(dtype="fp16"),
        scale=Scale(init_scale=2.0**20),
        resume=Resume(at=3, method="sharded_optimizer"),
    ),
    "fsdp2_sopt_adam": ParityConfig.from_flat(
        optimizer="adam", **_FSDP2, resume_at=3, resume_method="sharded_optimizer"
    ),
    "convnet_dropout": ParityConfig.from_flat(workload="convnet", **_FSDP2, resume_at=3, resume_method="dcp"),
    "fsdp1_into_fsdp2": ParityConfig(
        engine="fsdp1",
        optimizer="adam",
        layout=Layout(sharding="full_shard", use_orig_params=False),
        resume=Resume(at=3, method="dcp", layout="fully_shard"),
    ),
    "user_pair": ParityConfig.from_flat(
        workload="fixtures.resume_workloads:careful",
        optimizer="adam",
        **_FSDP2,
        resume_at=2,
        resume_method="user",
    ),
    "scheduled": ParityConfig.from_flat(
        workload="fixtures.resume_workloads:scheduled", **_FSDP2, resume_at=3, resume_method="dcp"
    ),
    "saves_nothing": ParityConfig.from_flat(
        workload="fixtures.resume_workloads:saves_nothing", **_FSDP2, resume_at=2, resume_method="user"
    ),
    # A head of one row: rank 1 holds none of it in FSDP1's sharded state dict, which torch's DCP
    # load planner took for a checkpoint of torch <= 2.3 (resume_store.CurrentFormatLoadPlanner).
    "narrow_head_dcp_fp16": ParityConfig(
        engine="fsdp1",
        workload="fixtures.resume_workloads:narrow_head",
        layout=Layout(sharding="full_shard", use_orig_params=False),
        precision=Precision(dtype="fp16"),
        resume=Resume(at=3, method="dcp"),
    ),
    "narrow_head_sopt": ParityConfig(
        engine="fsdp1",
        workload="fixtures.resume_workloads:narrow_head",
        layout=Layout(sharding="full_shard", use_orig_params=False),
        resume=Resume(at=3, method="sharded_optimizer"),
    ),
    "load_raises": ParityConfig.from_flat(
        workload="fixtures.resume_workloads:load_raises", **_FSDP2, resume_at=2, resume_method="user"
    ),
}
_PASSING = [
    "fsdp1_dcp_adam",
    "fsdp2_sopt_fp16",
    "fsdp1_sopt_fp16",
    "fsdp2_sopt_adam",
    "convnet_dropout",
    "fsdp1_into_fsdp2",
    "user_pair",
    "scheduled",
    "narrow_head_dcp_fp16",
    "narrow_head_sopt",
]


def test_a_resume_row_names_its_step_and_method_in_its_id():
    assert _ROWS["fsdp1_dcp_adam"].id == "fsdp1-full_shard-flat-fp32-adam-resume@3-dcp-w2"
    assert _ROWS["fsdp2_sopt_fp16"].id.endswith("-resume@3-sopt-w2")
    assert "resume" in _ROWS["user_pair"].keywords


def test_a_resume_row_has_a_reference_of_its_own_whose_rng_runs_on():
    plain = _ROWS["fsdp1_dcp_adam"].with_(resume_at=None, resume_method=None)
    assert plain.reference_key() != _ROWS["fsdp1_dcp_adam"].reference_key()
    assert _ROWS["fsdp1_dcp_adam"].with_(resume_method="sharded_optimizer").reference_key() == (
        _ROWS["fsdp1_dcp_adam"].reference_key()
    )


@pytest.mark.parametrize("at", [0, 6, 9])
def test_a_resume_step_outside_the_run_is_refused_naming_the_range(at):
    with pytest.raises(ValueError, match="resume_at must be a step between 1 and 5"):
        ParityConfig(engine="ddp", resume=Resume(at=at, method="dcp"))


def test_a_row_resumed_in_another_layout_names_it_in_its_id():
    assert _ROWS["fsdp1_into_fsdp2"].id == "fsdp1-full_shard-flat-fp32-adam-resume@3-dcp-into_fully_shard-w2"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"resume_method": "sharded_optimizer"}, "needs a checkpoint DCP can reshard"),
        ({"precision": "fp16"}, "runs in fp32 without offload"),
        ({"resume_layout": "fsdp_flat"}, "is the layout the row saves in"),
        ({"resume_layout": "fsdp3"}, "resume_layout must be one of"),
    ],
)
def test_a_layout_change_the_engine_cannot_check_is_refused_naming_why(changes, message):
    with pytest.raises(ValueError, match=message):
        _ROWS["fsdp1_into_fsdp2"].with_(**changes)


def test_the_user_method_needs_a_workload_with_save_and_load():
    with pytest.raises(ValueError, match="needs a workload with save and load"):
        ParityConfig(engine="ddp", resume=Resume(at=2, method="user"))


def test_a_workload_declaring_save_without_load_is_refused():
    from fixtures.resume_workloads import careful

    with pytest.raises(WorkloadError, match="save needs load too"):
        careful().__class__(**{**careful().__dict__, "load": None})


def test_the_default_matrix_resumes_under_both_methods_engines_and_precisions():
    rows = [c for c in matrix.default_matrix() if c.resume.at is not None]
    assert {c.resume.method for c in rows} == set(resume_matrix.METHODS)
    assert {c.engine for c in rows if c.resume.layout is None} == {"fsdp1", "fsdp2"}
    assert {c.precision.dtype for c in rows} == {"fp32", "fp16"}
    assert "convnet" in {c.workload for c in rows}
    assert {(c.engine, c.resume.layout) for c in rows if c.resume.layout} == {
        ("fsdp1", "fully_shard"),
        ("fsdp2", "fully_shard_keep"),
        ("ddp", "fully_shard"),
    }


def test_a_workload_declaring_save_and_load_gets_resume_rows_of_its_own_method_halfway():
    rows = workload_matrix.for_workload("fixtures.resume_workloads:careful")
    resumed = [c for c in rows if c.resume.at is not None]
    assert {c.resume.method for c in resumed} == {"dcp", "sharded_optimizer", "user"}
    assert {c.resume.at for c in resumed} == {3}


def test_a_workload_without_save_gets_resume_rows_only_when_asked():
    assert not [c for c in workload_matrix.for_workload("mlp") if c.resume.at is not None]
    assert {
        c.resume.at
        for c in workload_matrix.for_workload("mlp", declared=Declared(resume_at=2))
        if c.resume.at
    } == {2}


def test_the_cli_resume_at_adds_resume_rows_to_a_workloads_matrix():
    done = cli_in_process("--workload", "mlp", "--resume-at", "4", "--list", "-k", "resume")
    assert done.returncode == 0, done.stderr
    assert sum("-resume@4-" in line for line in done.stdout.splitlines()) == 16


def test_the_cli_refuses_a_resume_step_past_the_run():
    done = cli_in_process("--workload", "mlp", "--resume-at", "6", "--list")
    assert done.returncode == 2 and "resume_at must be a step between 1 and 5" in done.stderr


def test_a_folder_that_cannot_be_written_is_an_error_naming_the_setting(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(resume.ResumeError, match=f"is not writable.*{resume.DIR_ENV}"):
        resume._writable(str(blocker / "checkpoint"))


def _folder_under(root: str) -> str:
    """On a rank: the error of a checkpoint folder made under ``root`` (rank 0 fails, every rank raises)."""
    import os

    os.environ[resume.DIR_ENV] = root
    try:
        resume._new_folder()
    except resume.ResumeError as error:
        return str(error)
    finally:
        del os.environ[resume.DIR_ENV]
    return "no error"


def test_a_checkpoint_folder_rank_0_cannot_make_is_an_error_on_every_rank_naming_the_setting(ranks, tmp_path):
    """Rank 0 makes the folder; what it met making one reaches every rank as an error, not a path."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    said = ranks.run(_folder_under, str(blocker), world_size=2)
    assert [text.split("]")[0] for text in said] == ["[rank 0", "[rank 1"], said
    for text in said:
        assert f"cannot make a checkpoint folder under {blocker}: " in text, text
        assert f"set {resume.DIR_ENV} to a writable folder every rank sees" in text and "!" not in text


@pytest.fixture(scope="module")
def resumed(module_ranks):
    """``{name: Outcome}`` of every row of :data:`_ROWS`."""
    outcomes = runner.run(list(_ROWS.values()), ranks_executor(module_ranks), localize=False)
    return dict(zip(_ROWS, outcomes, strict=True))


@pytest.mark.parametrize("name", _PASSING)
def test_a_resumed_run_trains_bitwise_like_the_run_straight_through(resumed, name):
    outcome = resumed[name]
    assert outcome.passed, describe(outcome)
    assert outcome.result.closeness == "bitwise"


def test_the_resumed_step_records_that_every_state_was_restored(resumed):
    step = resumed["fsdp1_dcp_adam"].candidate.steps[3]
    assert [audit.restored for audit in step.resume] == [{}, {}]
    assert [audit.weights_at_forward for audit in step.resume] == [True, True]
    assert resumed["fsdp1_dcp_adam"].candidate.steps[2].resume == ()


def test_a_save_that_writes_nothing_is_an_error_naming_the_rank_and_function(resumed):
    result = resumed["saves_nothing"].result
    assert result.status == "crash", describe(resumed["saves_nothing"])
    assert "[rank 0] the resume's write failed in workload 'saves_nothing''s save(" in result.detail
    assert "save_nothing" in result.detail and "wrote nothing" in result.detail


def test_a_load_that_raises_is_an_error_naming_the_rank_and_function(resumed):
    result = resumed["load_raises"].result
    assert result.status == "crash", describe(resumed["load_raises"])
    assert "the resume's load failed in workload 'load_raises''s load(" in result.detail
    assert "RuntimeError: checkpoint in" in result.detail


def test_parity_test_resume_at_expands_into_resume_rows_at_that_step():
    from harness.parity.doors import pytest_plugin

    configs = pytest_plugin._configs("mlp", {"declared": Declared(resume_at=2), "k": "resume and fsdp2"})
    assert configs and {c.resume.at for c in configs} == {2}
