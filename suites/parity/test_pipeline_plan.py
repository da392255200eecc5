"""The pipeline axes before any rank runs: what a configuration, a cut, the CLI and ``parity_test``
accept, the order each schedule adds its microbatches in (read from torch's own schedule), and the
error that names the fix for what they refuse. Pure: no ranks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from harness.parity.doors import pytest_plugin
from harness.parity.doors.testing import parity_test
from harness.parity.judge.expected import expected_failure
from harness.parity.plan.config import Mesh, ParityConfig, unsupported_reason
from harness.parity.plan.config.mesh import SCHEDULES
from harness.parity.plan.matrices import pipeline as pipeline_matrix
from harness.parity.ranks.sides import stages
from harness.parity.ranks.sides.pipeline import halves
from harness.parity.workload import registry
from harness.parity.workload.builtin import llama
from suites.parity.support import cli_in_process

_PP = {"engine": "fsdp2", "reshard_after_forward": True, "workload": "llama", "world_size": 4, "pp": 2}


def test_ids_name_the_pipeline_and_its_reference_follows_the_order_not_the_schedule():
    gpipe = ParityConfig.from_flat(**_PP, schedule="gpipe")
    one = ParityConfig.from_flat(**_PP, schedule="1f1b")
    bfs = ParityConfig.from_flat(**_PP, schedule="looped_bfs")
    assert gpipe.id == "fsdp2-pp2-gpipe-mb4-reshard-fp32-sgd-llama-w4"
    assert gpipe.reference_key() == one.reference_key() != bfs.reference_key()
    assert gpipe.mesh.data_rank(3, 4) == 1 and gpipe.mesh.data_parallel_size(4) == 2


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"schedule": "zb"}, "schedule must be one of"),
        ({"pp": 1}, "pp must be >= 2 stages"),
        ({"pp": 3}, "pp must be a degree that divides world_size 4"),
        ({"microbatches": 0}, "microbatches must be >= 1"),
        ({"workload": "mlp"}, "'mlp' has no pp_split: give it Workload(pp_split="),
        ({"hsdp": 2}, "hsdp is a 2-D mesh of its own"),
        ({"tp": 4}, "pp=2 x tp=4 needs a world size their product divides"),
        ({"engine": "ddp", "reshard_after_forward": None}, "pp=2 is a 2-D mesh for engine='fsdp2'"),
    ],
)
def test_a_pipeline_the_engine_cannot_run_is_refused_naming_the_fix(fields, words):
    with pytest.raises(ValueError, match=None) as refused:
        ParityConfig.from_flat(**{**_PP, **fields})
    assert words in str(refused.value)


def test_pp_and_tp_make_one_3d_mesh_whose_batch_follows_the_dp_coordinate():
    config = ParityConfig.from_flat(**{**_PP, "world_size": 8}, tp=2, schedule="zbv")
    assert config.id == "fsdp2-pp2-zbv-mb4-tp2-reshard-fp32-sgd-llama-w8"
    assert config.mesh.shape(8) == ((2, 2, 2), ("pp", "dp", "tp"))
    assert [config.mesh.data_rank(r, 8) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert config.mesh.data_parallel_size(8) == 2
    assert stages.stage_groups(config) == ((("pp", 2), ("dp", 2), ("tp", 2)), ("dp",))
    assert stages.tp_grid(config) == ((2, 2), ("dp", "tp"))


def test_the_decoder_is_cut_evenly_its_last_stage_the_larger_and_each_rank_holds_its_stages():
    model = llama.Decoder()
    assert stages.items(model) == ["embed", "layers.0", "layers.1", "norm", "output"]
    workload = registry.get("llama")
    assert stages.stages_of(workload, model, 2) == [["embed", "layers.0"], ["layers.1", "norm", "output"]]
    assert stages.stages_of(workload, model, 4) == [["embed"], ["layers.0"], ["layers.1"], ["norm", "output"]]
    assert stages.held_stages(Mesh(pp=2, schedule="interleaved1f1b"), 1) == [1, 3]
    assert stages.held_stages(Mesh(pp=2, schedule="zbv"), 0) == [0, 3]
    assert stages.held_stages(Mesh(pp=2, schedule="1f1b"), 1) == [1]


def test_a_stage_keeps_the_whole_models_names_and_runs_as_the_whole_model_does():
    torch.manual_seed(0)
    model = llama.Decoder()
    stages.untie(model)
    first, last = (
        stages.cut(model, kept, in_place=False) for kept in stages.stages_of(registry.get("llama"), model, 2)
    )
    assert [n for n, _ in first.named_parameters()][:2] == ["embed.weight", "layers.0.attention_norm.weight"]
    assert "output.weight" in dict(last.named_parameters()) and last.embed is None
    tokens = torch.randint(0, llama.VOCAB, (2, llama.SEQUENCE))
    assert torch.equal(last(first(tokens)), model(tokens))


def test_untying_gives_the_head_a_copy_of_its_own():
    model = llama.Decoder()
    assert stages.untie(model) == [("embed.weight", "output.weight")]
    assert model.output.weight is not model.embed.weight
    assert torch.equal(model.output.weight, model.embed.weight)


def test_a_cut_that_would_rename_a_module_list_or_miscount_the_stages_is_refused():
    class Listed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))

    with pytest.raises(ValueError, match="make it an nn.ModuleDict keyed '0', '1'"):
        stages.cut(Listed(), ["layers.0"], in_place=False)
    points = dataclasses.replace(registry.get("llama"), pp_split=("layers.1",))
    with pytest.raises(ValueError, match="cuts 2 stages and the schedule runs 4"):
        stages.stages_of(points, llama.Decoder(), 4)
    with pytest.raises(ValueError, match="microbatches=3 does not divide the batch's 4 rows"):
        stages.split_microbatches(torch.zeros(4, 2), 3)


@pytest.mark.parametrize("schedule", ["looped_bfs", "dualpipev"])
def test_the_twins_microbatch_order_is_the_one_torchs_schedule_adds_them_in(schedule):
    """Every stage of torch 2.13's LoopedBFS (last first) and DualPipeV (first first) adds its
    weight gradients in the order ``stages.backward_order`` gives, read from the schedule's own
    rank operations (built here over stand-in stages: no process group). The other schedules
    compute theirs in ``__init__`` from their stages; each run checks them there
    (``candidate.PipelineFSDP2._check_order``), and their rows pass bitwise."""
    from torch.distributed import pipelining

    cls = getattr(pipelining, SCHEDULES[schedule][0])
    schedule_object = cls.__new__(cls)
    schedule_object._n_microbatches = 4
    schedule_object.pp_group_size = 2
    schedule_object._stages = [None, None]
    schedule_object.n_local_stages = 2
    schedule_object._num_stages = 4
    schedule_object.stage_index_to_group_rank = {
        index: rank for rank in range(2) for index in stages.held_stages(Mesh(pp=2, schedule=schedule), rank)
    }
    wanted = stages.backward_order(schedule, 4)
    for rank in range(2):
        actions = _rank_actions(schedule_object, rank)
        for stage in stages.held_stages(Mesh(pp=2, schedule=schedule), rank):
            assert stages.weight_order(actions, stage) == wanted, (schedule, rank, stage)


def _rank_actions(schedule: object, rank: int) -> list[object]:
    """``rank``'s actions as torch's schedule computes them (``_calculate_single_rank_operations``)."""
    return schedule._calculate_single_rank_operations(rank)  # type: ignore[attr-defined]


def test_the_matrix_runs_every_schedule_in_both_layouts_and_expects_what_it_must():
    rows = pipeline_matrix.rows("llama", world_size=2)
    assert len(rows) == len(SCHEDULES) * (2 * 4 * 2 + 1)
    assert [r.id for r in rows if unsupported_reason(r)] == []
    expected = [r for r in rows if expected_failure(r)]
    assert {(r.mesh.schedule, r.layout.reshard_after_forward) for r in expected} == {
        ("interleaved_zb", True),
        ("zbv", True),
        ("dualpipev", True),
    }
    assert pipeline_matrix.rows("mlp") == [] and pipeline_matrix.rows("llama", world_size=3) == []


def test_the_cli_runs_the_pipeline_rows_with_pp_and_says_the_stages():
    done = cli_in_process("--workload", "llama", "--pp", "2", "--schedule", "zbv", "--list")
    assert done.returncode == 0, done.stderr
    assert "fsdp2-pp2-zbv-mb4-keep-fp16-adamw-llama-w2" in done.stdout
    assert "fsdp2-pp2-1f1b" not in done.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--pp", "2"), "--pp runs a --workload's pipeline rows"),
        (("--workload", "llama", "--pp", "3"), "a --world-size it divides"),
        (("--workload", "llama", "--schedule", "zbv"), "--schedule zbv needs --pp N"),
        (("--workload", "llama", "--pp", "2", "--schedule", "zb"), "--schedule must be one of"),
        (("--workload", "mlp", "--pp", "2"), "'mlp' has no pp_split"),
        (
            ("--workload", "llama", "--pp", "2", "--tp", "2", "--world-size", "6"),
            "a --world-size their product",
        ),
    ],
)
def test_the_cli_refuses_a_pipeline_it_cannot_run_naming_the_fix(args, words):
    done = cli_in_process(*args, "--list")
    assert done.returncode == 2 and words in done.stderr, done.stderr


def test_the_cli_runs_pp_with_tp_on_a_3d_mesh():
    done = cli_in_process(
        "--workload", "llama", "--pp", "2", "--tp", "2", "--world-size", "8", "--schedule", "1f1b", "--list"
    )
    assert done.returncode == 0, done.stderr
    assert "fsdp2-pp2-1f1b-mb4-tp2-keep-bf16-reduce32-adamw-llama-w8" in done.stdout


def test_parity_test_with_pp_expands_the_pipeline_rows_of_its_schedule():
    configs = pytest_plugin._configs("llama", {"pp": (2, "gpipe", 4), "world_size": 2, "k": ""})
    assert {c.mesh.schedule for c in configs} == {"gpipe"} and len(configs) == 17
    with pytest.raises(ValueError, match=r"a world_size they divide.*Mesh\(pp=2"):
        parity_test("llama", mesh=Mesh(pp=2), world_size=3)


def test_the_ground_truth_cuts_a_pipelines_microbatches_from_each_ranks_batch():
    from harness.parity.judge import semantics
    from harness.parity.ranks.truth import pieces

    workload = registry.get("llama")
    split = pieces.Split(ranks=2, microbatches=4, num_items=False, cut=True)
    found = pieces.step_pieces(workload, 0, split, step=1)
    assert [(p.rank, p.microbatch, p.index) for p in found[:5]] == [
        (0, 0, 1),
        (0, 1, 1),
        (0, 2, 1),
        (0, 3, 1),
        (1, 0, 1),
    ]
    whole = registry.make_batch(workload, 0, 0, 1)
    assert torch.equal(
        torch.cat([p.batch for p in found[:4]]), whole.double() if whole.is_floating_point() else whole
    )
    config = ParityConfig.from_flat(**{**_PP, "world_size": 2}, schedule="gpipe")
    assert semantics.name(config) == "llama-dp1-mb4"


def test_dualpipev_over_fewer_microbatches_than_stages_is_skipped_naming_torchs_rule():
    config = ParityConfig.from_flat(**{**_PP, "world_size": 2}, schedule="dualpipev", microbatches=2)
    assert "DualPipeV needs at least as many microbatches as stages (4), got 2" in unsupported_reason(config)
    assert unsupported_reason(config.with_(microbatches=4)) is None


def test_microbatches_that_do_not_divide_the_batch_are_refused_before_any_rank_runs():
    done = cli_in_process("--workload", "llama", "--pp", "2", "--microbatches", "3", "--list")
    assert done.returncode == 2, done.stderr
    assert (
        "--microbatches 3 does not divide the batch of 'llama' (4 rows): use one of [1, 2, 4]" in done.stderr
    )


def test_a_split_backward_moves_its_sums_into_the_reduce_dtype_where_fsdp2s_hook_runs():
    """Torch 2.13's ZBV at pp 2 over 4 microbatches, planned over stand-in stages: stage 1 runs
    its last two weight halves after its last input half (``1I2 2I3 1I3 1W2 2W3 1W3``), so FSDP2
    moves microbatches 0 and 1 alone and sums 2 and 3 in bf16 first (logged on ranks: FSDP2's
    ``to_accumulated_grad_if_needed`` then ``accumulate_unsharded_grad_if_needed``); the first
    stage's weight half is a full backward, moved each time; a full-backward schedule moves every
    microbatch."""
    zbv = halves.planned("zbv", 2, 4, [0, 3])
    assert zbv is not None
    moves = {stage: halves.moved_after(zbv, stage) for stage in range(4)}
    assert moves == {0: {0, 1, 2, 3}, 1: {0, 1}, 2: {0, 1, 2}, 3: {0, 1, 2}}
    gpipe = halves.planned("gpipe", 2, 4, [0])
    assert gpipe is not None and halves.moved_after(gpipe, 1) == {0, 1, 2, 3}


def test_a_split_backward_row_reducing_in_float32_gets_a_reference_of_its_own_schedule():
    """Its twin sums as its schedule plans (``halves``), so it shares no reference with another
    schedule's row; where the reduce dtype is the parameters', the schedules' rows share one."""

    def key(schedule: str, recipe: str) -> tuple[object, ...]:
        fields = {**_PP, "reshard_after_forward": False, "precision": "bf16"}
        return ParityConfig.from_flat(**fields, schedule=schedule, recipe=recipe).reference_key()

    assert key("zbv", "reduce32") != key("gpipe", "reduce32")
    assert key("zbv", "pure") == key("gpipe", "pure")
