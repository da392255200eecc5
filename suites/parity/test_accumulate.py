"""Gradient accumulation over microbatches, syncing every microbatch or only the last: FSDP1 and
FSDP2 train bitwise like their hand-reduced DDP twin, a skipped step discards every microbatch,
and a twin that accumulates in another dtype than its candidate is named (``accumulation_dtype``)."""

import pytest
import torch

from fixtures.parity_plants import Plant, planted_executor
from fixtures.parity_records import replace_step, run, step
from harness.parity.doors import runner
from harness.parity.judge import causes
from harness.parity.judge.compare import compare_runs
from harness.parity.plan import profiles
from harness.parity.plan.config import Loop, ParityConfig
from harness.parity.plan.matrices import default as matrix
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from harness.parity.ranks.sides import accumulate
from suites.parity.support import cli_in_process, describe, ranks_executor

_FSDP1 = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": False}
_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True}
_LAST = {"recipe": "reduce32", "precision": "bf16", "accumulate": 2, "sync": "last"}
_ROWS = {
    "fsdp1_last": ParityConfig.from_flat(**_FSDP1, **_LAST),
    "fsdp2_last": ParityConfig.from_flat(**_FSDP2, **_LAST),
    "fsdp1_every": ParityConfig.from_flat(
        **{**_FSDP1, "use_orig_params": True}, precision="fp16", accumulate=2
    ),
    "fsdp2_every": ParityConfig.from_flat(**_FSDP2, precision="bf16", accumulate=3),
    "overflow": ParityConfig.from_flat(
        **_FSDP2,
        precision="fp16",
        accumulate=4,
        sync="last",
        init_scale=2.0**20,
    ),
}


def test_microbatches_and_the_sync_mode_are_named_in_the_id_and_one_microbatch_is_not():
    assert _ROWS["fsdp1_last"].id == "fsdp1-full_shard-flat-bf16-reduce32-sgd-acc2-synclast-w2"
    assert _ROWS["fsdp1_every"].id == "fsdp1-full_shard-orig-fp16-sgd-acc2-w2"
    assert "acc" not in ParityConfig.from_flat(**_FSDP1).id


def test_syncing_only_the_last_of_one_microbatch_is_refused():
    with pytest.raises(ValueError, match="needs accumulate > 1"):
        ParityConfig.from_flat(**_FSDP1, sync="last")


def test_a_ddp_candidate_cannot_accumulate():
    with pytest.raises(ValueError, match="DDP's own reducer re-reduces"):
        ParityConfig(engine="ddp", loop=Loop(accumulate=2))


def test_each_accumulation_has_a_reference_of_its_own():
    keys = {
        c.reference_key()
        for c in (
            ParityConfig.from_flat(**_FSDP1),
            _ROWS["fsdp1_last"],
            _ROWS["fsdp1_last"].with_(sync="every"),
        )
    }
    assert len(keys) == 3


@pytest.mark.parametrize(
    ("config", "dtype"),
    [
        (_ROWS["fsdp1_last"], torch.bfloat16),  # FSDP1: the parameter dtype, whatever the reduce
        (_ROWS["fsdp2_last"], torch.float32),  # FSDP2: the reduce dtype
        (ParityConfig.from_flat(**_FSDP2, accumulate=2, sync="last"), torch.float32),
    ],
    ids=["fsdp1", "fsdp2", "fp32"],
)
def test_each_engine_sums_unsynced_gradients_in_the_dtype_its_sources_say(config, dtype):
    assert accumulate.unsynced_dtype(config) == dtype


def test_the_default_matrix_accumulates_in_both_sync_modes_under_both_engines():
    rows = [c for c in matrix.default_matrix() if c.loop.accumulate > 1]
    assert {c.loop.sync for c in rows} == {"every", "last"}
    assert {c.engine for c in rows if c.loop.sync == "last"} == {"fsdp1", "fsdp2"}


def test_a_workloads_matrix_runs_the_users_accumulation_under_every_layout():
    rows = [
        c
        for c in workload_matrix.for_workload("mlp", declared=Declared(accumulate=4, sync="last"))
        if c.loop.accumulate > 1
    ]
    assert {(c.loop.accumulate, c.loop.sync) for c in rows} == {(4, "last")} and len(rows) == 12 * 2


def test_accumulate_without_a_workload_exits_2_naming_the_k_filter():
    done = cli_in_process("--accumulate", "2", "--list")
    assert done.returncode == 2 and "-k 'accumulate=2'" in done.stderr


def _accumulated(reference, candidate):
    ref = run(replace_step(step(0), accumulated_in=reference))
    cand = run(replace_step(step(0, grad=0.25 + 2**-10), accumulated_in=candidate))
    return causes.match(ref, cand, compare_runs(ref, cand, profile=profiles.EXACT))


def test_gradients_accumulated_in_bfloat16_against_float32_are_named_accumulation_dtype():
    found = {c.name: c for c in _accumulated("float32", "bfloat16")}
    cause = found["accumulation_dtype"]
    assert "the candidate accumulated in the lower dtype, bfloat16" in cause.evidence
    assert "FSDP1's no_sync() in the parameter dtype" in cause.explanation


def test_runs_that_accumulate_in_the_same_dtype_are_no_accumulation_cause():
    assert "accumulation_dtype" not in [c.name for c in _accumulated("float32", "float32")]


@pytest.fixture(scope="module")
def accumulated(module_ranks):
    """``{name: Outcome}`` of every row of :data:`_ROWS`."""
    outcomes = runner.run(list(_ROWS.values()), ranks_executor(module_ranks))
    return dict(zip(_ROWS, outcomes, strict=True))


@pytest.mark.parametrize("name", list(_ROWS))
def test_fsdp_accumulating_microbatches_trains_bitwise_like_its_twin(accumulated, name):
    outcome = accumulated[name]
    assert outcome.passed, describe(outcome)
    assert outcome.result.closeness == "bitwise"


def test_a_skipped_step_discards_every_microbatchs_gradients_on_both_sides(accumulated):
    outcome = accumulated["overflow"]
    assert outcome.passed and outcome.result.skipped_steps, describe(outcome)
    first = outcome.result.skipped_steps[0]
    assert (
        outcome.candidate.steps[first].skipped_anywhere()
        and outcome.reference.steps[first].skipped_anywhere()
    )


def test_each_run_records_the_dtype_it_summed_unsynced_gradients_in(accumulated):
    outcome = accumulated["fsdp1_last"]
    assert {s.accumulated_in for s in outcome.candidate.steps} == {"bfloat16"}
    assert {s.accumulated_in for s in outcome.reference.steps} == {"bfloat16"}
    assert {s.accumulated_in for s in accumulated["fsdp1_every"].candidate.steps} == {None}


@pytest.fixture(scope="module")
def twin_in_reduce_dtype(module_ranks):
    """FSDP1 ``no_sync()`` under an fp32 reduce against a twin that accumulates in float32."""

    plant = Plant(kind="reference_accumulates_in_reduce_dtype")
    (outcome,) = runner.run([_ROWS["fsdp1_last"]], planted_executor(module_ranks, plant), localize=False)
    return outcome


def test_fsdp1_accumulating_in_bfloat16_against_a_float32_twin_fails(twin_in_reduce_dtype):
    assert twin_in_reduce_dtype.result.status == "fail", describe(twin_in_reduce_dtype)


def test_fsdp1_accumulating_in_bfloat16_against_a_float32_twin_is_named_accumulation_dtype(
    twin_in_reduce_dtype,
):
    names = [c.name for c in twin_in_reduce_dtype.result.causes]
    assert "accumulation_dtype" in names, describe(twin_in_reduce_dtype)


def test_the_cli_lists_the_users_accumulation_under_every_layout():
    done = cli_in_process("--workload", "mlp", "--accumulate", "4", "--sync", "last", "--list")
    assert done.returncode == 0, done.stderr
    assert (
        sum(line.split(" ")[0].endswith("-acc4-synclast-w2") for line in done.stdout.splitlines()) == 12 * 2
    )


def test_parity_test_passes_the_users_loop_to_the_workloads_matrix():
    from harness.parity.doors import pytest_plugin

    options = {
        "declared": Declared(clip=0.5, accumulate=4, sync="last", checkpoint=True),
        "k": "fsdp2 and reshard",
    }
    configs = pytest_plugin._configs("convnet", options)
    assert {c.loop.clip for c in configs if c.loop.path == "unscale_clip"} == {0.5}
    assert {(c.loop.accumulate, c.loop.sync) for c in configs if c.loop.accumulate > 1} == {(4, "last")}
    assert any(
        c.loop.checkpoint == "replay" and c.layout.offload for c in configs
    )  # every layout: offload too


def test_the_report_says_each_rows_loop_beside_its_optimizer():
    from harness.parity.report import markdown

    config = _ROWS["fsdp1_last"].with_(path="unscale_clip", clip=0.05, checkpoint="replay")
    assert markdown._loop_words(config) == " (unscale_clip 0.05, acc2 synclast, ckpt)"
    assert markdown._loop_words(ParityConfig.from_flat(**_FSDP1)) == ""
