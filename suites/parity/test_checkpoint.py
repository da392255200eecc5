"""Activation checkpointing of the units, with dropout: with the RNG state replayed FSDP1 and FSDP2
train bitwise like their checkpointed twin; without replay the row fails at step 0 and is named
``checkpoint_rng`` (an expected failure in the matrix)."""

import pytest
import torch
from torch import nn

from fixtures.parity_records import replace_step, run, step
from harness.parity.doors import runner
from harness.parity.judge import causes
from harness.parity.judge.compare import compare_runs
from harness.parity.judge.result import expected_failure
from harness.parity.plan import profiles
from harness.parity.plan.config import Layout, Loop, ParityConfig
from harness.parity.plan.matrices import default as matrix
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from harness.parity.ranks.sides import checkpoint
from harness.parity.report import render
from suites.parity.support import cli_in_process, describe, ranks_executor

_CONV = {"workload": "convnet", "checkpoint": "replay"}
_ROWS = {
    "fsdp1_flat": ParityConfig.from_flat(
        engine="fsdp1", **_CONV, sharding="full_shard", use_orig_params=False
    ),
    "fsdp1_orig_bf16": ParityConfig.from_flat(
        engine="fsdp1",
        **_CONV,
        sharding="full_shard",
        use_orig_params=True,
        precision="bf16",
    ),
    "fsdp2_fp16": ParityConfig.from_flat(
        engine="fsdp2", **_CONV, reshard_after_forward=True, precision="fp16"
    ),
    "no_replay": ParityConfig(
        engine="fsdp2",
        workload="convnet",
        layout=Layout(reshard_after_forward=True),
        loop=Loop(checkpoint="no_replay"),
    ),
}


def test_checkpointing_is_named_in_the_id_with_or_without_replay_and_none_is_not():
    assert _ROWS["fsdp1_flat"].id == "fsdp1-full_shard-flat-fp32-sgd-convnet-ckpt-w2"
    assert _ROWS["no_replay"].id.endswith("-convnet-ckpt_norng-w2")
    assert (
        "ckpt"
        not in ParityConfig(engine="fsdp1", layout=Layout(sharding="full_shard", use_orig_params=False)).id
    )


def test_both_modes_share_the_replaying_reference_and_no_checkpoint_has_its_own():
    replay, no_replay = _ROWS["no_replay"].with_(checkpoint="replay"), _ROWS["no_replay"]
    assert replay.reference_key() == no_replay.reference_key()
    assert replay.reference_key() != no_replay.with_(checkpoint=None).reference_key()


def test_only_the_candidate_may_skip_the_replay():
    assert checkpoint.replays(_ROWS["no_replay"], "reference") is True
    assert checkpoint.replays(_ROWS["no_replay"], "candidate") is False
    assert checkpoint.replays(_ROWS["no_replay"].with_(checkpoint=None), "candidate") is None


def test_a_model_without_units_cannot_be_checkpointed():
    with pytest.raises(ValueError, match="checkpoint needs FSDP units"):
        checkpoint.apply([], replay=True, workload="flat")


def test_a_checkpointed_unit_recomputes_with_the_forwards_dropout_masks():
    torch.manual_seed(0)
    unit = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    x = torch.randn(3, 4)
    state = torch.random.get_rng_state()
    unit(x).sum().backward()
    plain = unit[0].weight.grad.clone()
    unit.zero_grad()
    checkpoint.apply([unit], replay=True, workload="test")
    torch.random.set_rng_state(state)
    unit(x).sum().backward()
    assert torch.equal(unit[0].weight.grad, plain)


def test_the_row_without_replay_is_an_expected_failure_naming_its_cause():
    assert "checkpoint_rng" in expected_failure(_ROWS["no_replay"])
    assert expected_failure(_ROWS["fsdp1_flat"]) == ""


def test_the_default_matrix_checkpoints_the_conv_net_with_replay_only():
    rows = [c for c in matrix.default_matrix() if c.loop.checkpoint]
    assert {c.loop.checkpoint for c in rows} == {"replay"} and {c.workload for c in rows} == {"convnet"}


def test_a_workloads_matrix_checkpoints_under_every_layout_when_the_user_does():
    rows = [
        c
        for c in workload_matrix.for_workload("convnet", declared=Declared(checkpoint=True))
        if c.loop.checkpoint
    ]
    assert {c.loop.checkpoint for c in rows} == {"replay"} and len(rows) == 12 * 2


def _replayed(candidate_mode):
    ref = run(replace_step(step(0), checkpoint="replay"))
    cand = run(replace_step(step(0, grad=0.5), checkpoint=candidate_mode))
    return causes.match(ref, cand, compare_runs(ref, cand, profile=profiles.EXACT))


def test_gradients_differing_after_a_recompute_without_replay_are_named_checkpoint_rng():
    found = {c.name: c for c in _replayed("no_replay")}
    assert "the losses match, the gradients differ" in found["checkpoint_rng"].evidence
    assert "preserve_rng_state" in found["checkpoint_rng"].explanation


def test_a_candidate_that_replayed_is_no_checkpoint_rng():
    assert "checkpoint_rng" not in [c.name for c in _replayed("replay")]


@pytest.fixture(scope="module")
def checkpointed(module_ranks):
    """``{name: Outcome}`` of every row of :data:`_ROWS`."""
    outcomes = runner.run(list(_ROWS.values()), ranks_executor(module_ranks), localize=False)
    return dict(zip(_ROWS, outcomes, strict=True))


@pytest.mark.parametrize("name", ["fsdp1_flat", "fsdp1_orig_bf16", "fsdp2_fp16"])
def test_fsdp_checkpointing_units_with_dropout_trains_bitwise_like_its_twin(checkpointed, name):
    outcome = checkpointed[name]
    assert outcome.passed, describe(outcome)
    assert outcome.result.closeness == "bitwise"


def test_each_run_records_how_it_recomputed(checkpointed):
    outcome = checkpointed["no_replay"]
    assert {s.checkpoint for s in outcome.candidate.steps} == {"no_replay"}
    assert {s.checkpoint for s in outcome.reference.steps} == {"replay"}


def test_checkpointing_without_replay_under_dropout_fails_at_step_0_in_the_gradients(checkpointed):
    result = checkpointed["no_replay"].result
    assert result.status == "fail" and result.first_diverging_step == 0
    assert result.divergences[0].what == "grad" and render.label(result) == "xfail"


def test_checkpointing_without_replay_under_dropout_is_named_checkpoint_rng(checkpointed):
    assert [c.name for c in checkpointed["no_replay"].result.causes][:1] == ["checkpoint_rng"]


def test_the_cli_checkpoints_a_workloads_units_under_every_layout():
    done = cli_in_process("--workload", "convnet", "--checkpoint", "--list", "-k", "ckpt")
    assert done.returncode == 0, done.stderr
    assert sum(line.split(" ")[0].endswith("-convnet-ckpt-w2") for line in done.stdout.splitlines()) == 12 * 2
