"""A user's ``parallelize`` function that builds a pipeline itself (its stages, their
``fully_shard`` calls, its schedule): its rows pass bitwise against the whole model's twin when it
is correct, and its bugs fail named or are refused naming the way out
(``fixtures/user_pipelines.py``; ``ranks/sides/user/pipeline.py``). ``make test`` runs pp 2 at
world size 2; the ``pipeline`` tier pp 2 x dp 2 at world size 4 and compiled stages (``aot_eager``),
the ``compile`` tier inductor's against a twin compiled alike and an eager one.
"""

from __future__ import annotations

import pytest

from harness.parity.doors import runner
from harness.parity.doors.testing import ranks_executor
from harness.parity.plan.config import Mesh, ParityConfig
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.ranks.sides.user import discover, pipeline
from harness.parity.ranks.sides.user.found import Compiled

_FUNCTIONS = "fixtures.user_pipelines"


def _plain(name: str, world_size: int = 2, mesh: str = "pp=2,dp=1") -> ParityConfig:
    configs = workload_matrix.for_workload(f"{_FUNCTIONS}:{name}_workload", world_size=world_size, mesh=mesh)
    return next(c for c in configs if not c.faults)


def test_a_pipeline_function_gets_the_plain_and_non_finite_rows():
    configs = workload_matrix.for_workload(f"{_FUNCTIONS}:pp_1f1b_workload", mesh="pp=2,dp=1")
    assert [c.id for c in configs] == [
        "user-pp2xdp1-adamw-pp_1f1b-w2",
        "user-pp2xdp1-adamw-pp_1f1b-inf@r1s2-w2",
        "user-pp2xdp1-adamw-pp_1f1b-inf@alls2-w2",
    ]


def test_the_stages_of_a_users_pipeline_share_their_dp_coordinates_batch():
    mesh = Mesh(dims=(("pp", 2), ("dp", 2)))
    assert [mesh.data_rank(rank) for rank in range(4)] == [0, 1, 0, 1]
    assert mesh.data_parallel_size(4) == 2
    assert mesh.user_stages == 2


@pytest.mark.parametrize(
    ("mesh", "words"),
    [("pp=1,dp=2", "at least 2 stages"), ("pp=2,dp=2", "holds 4 ranks, not the world size 2")],
)
def test_a_pipeline_mesh_the_twin_does_not_mirror_is_refused_naming_it(mesh, words):
    with pytest.raises(ValueError, match=words):
        workload_matrix.for_workload(f"{_FUNCTIONS}:pp_1f1b_workload", world_size=2, mesh=mesh)


def test_a_correct_pipeline_function_passes_bitwise_and_says_what_it_built(module_ranks):
    (outcome,) = runner.run([_plain("pp_1f1b")], ranks_executor(module_ranks))
    result = outcome.result
    assert (result.status, result.closeness) == ("pass", "bitwise"), result.reason
    assert "torch's Schedule1F1B over 4 microbatches, stages [0] of 2 here" in result.candidate
    assert "layers.1: fully_shard over dp 1" in result.candidate  # the other stage's units, gathered
    assert "the whole model over the 4 microbatches of your Schedule1F1B" in result.reference


def test_a_schedule_that_does_not_divide_by_the_microbatches_fails_at_step_0_named(module_ranks):
    (outcome,) = runner.run([_plain("pp_unscaled")], ranks_executor(module_ranks))
    result = outcome.result
    assert result.status == "fail" and result.first_diverging_step == 0, result.reason
    assert "scale_grads=False" in result.candidate
    assert [c.name for c in result.causes] == ["pp_microbatch_scaling"], result.causes


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("pp_tied", "the tied parameter embed.weight = output.weight has a copy in stages [0, 1]"),
        ("pp_returns_model", "parallelize must return the schedule it built"),
    ],
)
def test_what_the_twin_cannot_mirror_is_an_error_naming_the_way_out(module_ranks, name, words):
    (outcome,) = runner.run([_plain(name)], ranks_executor(module_ranks))
    assert outcome.result.status == "error"
    assert words in outcome.result.reason, outcome.result.reason


def _stage_part(index: int, module: str, backend: object = "aot_eager") -> dict:
    compiled = Compiled(
        module=module, backend=backend, backend_name=str(backend), fullgraph=False, dynamic=None,
        how="module.compile()",
    )  # fmt: skip
    return {
        "index": index, "units": (), "checkpointed": (), "compiled": [compiled], "never": (),
        "refused": (), "params": [f"{module}.w"], "buffers": [], "tp": (), "tp_degree": None, "tp_dim": None,
    }  # fmt: skip


def test_every_stages_compiled_modules_reach_the_whole_twin():
    """Each stage's compiles, as every rank gathered them, become the twin's, in stage order."""
    found = pipeline._merge(
        [_stage_part(1, "layers.1"), _stage_part(0, "layers.0")], {"layers.0.w", "layers.1.w"}, [], []
    )
    assert not found.refused, found.refused
    assert [c.module for c in found.compiled] == ["layers.0", "layers.1"]


def test_a_compile_whose_backend_cannot_travel_to_the_other_stages_is_refused_naming_the_way_out():
    found = discover.Found(
        compiled=(_stage_part(0, "layers.0", backend=lambda gm, inputs: gm)["compiled"][0],)
    )
    (why,) = pipeline._unsendable(found)
    assert "layers.0 is compiled with a backend that cannot be pickled" in why
    assert "backend='inductor'" in why


@pytest.mark.pipeline
def test_a_pipeline_whose_stages_compile_their_layers_passes_bitwise_compiled_alike(module_ranks):
    """Each stage compiles its layers (``aot_eager``): the specs are gathered from every stage and
    every rank's whole twin compiles the same modules with the same backend."""
    (outcome,) = runner.run([_plain("pp_compiled")], ranks_executor(module_ranks))
    result = outcome.result
    assert (result.status, result.closeness) == ("pass", "bitwise"), result.reason
    assert "layers.0: module.compile() (aot_eager)" in result.candidate  # stage 0's, seen from both
    assert "layers.1: module.compile() (aot_eager)" in result.candidate
    assert "2 modules compiled as yours" in result.reference


@pytest.mark.compile
def test_an_inductor_compiled_pipeline_is_bitwise_only_against_a_twin_compiled_alike(module_ranks):
    """Inductor's fused kernels round otherwise than eager: compiled alike, the twin is bitwise; an
    eager twin fails, naming compile's own difference."""
    configs = workload_matrix.for_workload(
        f"{_FUNCTIONS}:pp_inductor_workload", mesh="pp=2,dp=1", compile_twin="eager"
    )
    plain = [c for c in configs if not c.faults]
    alike, eager = runner.run(plain, ranks_executor(module_ranks))
    assert (alike.result.status, alike.result.closeness) == ("pass", "bitwise"), alike.result.reason
    assert eager.result.status == "fail", eager.result.reason
    assert eager.result.causes[0].name == "compile_changes_numerics", eager.explanation


@pytest.mark.pipeline
@pytest.mark.parametrize("name", ["pp_1f1b", "pp_gpipe_bf16", "pp_looped"])
def test_a_correct_pipeline_function_passes_bitwise_at_pp2_dp2(module_ranks, name):
    configs = workload_matrix.for_workload(f"{_FUNCTIONS}:{name}_workload", world_size=4, mesh="pp=2,dp=2")
    for outcome in runner.run(configs, ranks_executor(module_ranks)):
        result = outcome.result
        assert (result.status, result.closeness) == ("pass", "bitwise"), (result.config.id, result.reason)


@pytest.mark.pipeline
def test_a_pipeline_of_tensor_parallel_stages_passes_bitwise_at_pp2_dp2_tp2(module_ranks):
    """Each stage's layers split by Megatron's plan inside the function (``--mesh pp=2,dp=2,tp=2``):
    the styles are read per stage, gathered, and mirrored on the whole twin."""
    configs = workload_matrix.for_workload(
        f"{_FUNCTIONS}:pp_tp_workload", world_size=8, mesh="pp=2,dp=2,tp=2"
    )
    for outcome in runner.run(configs, ranks_executor(module_ranks)):
        result = outcome.result
        assert (result.status, result.closeness) == ("pass", "bitwise"), (result.config.id, result.reason)
        assert "fully_shard on 4 modules, TP on 14 modules" in result.candidate  # both stages' 7 each


def test_a_zero_bubble_pipeline_reducing_in_float32_passes_bitwise(module_ranks):
    """ZBV over bf16 parameters reducing in float32: the twin sums each stage's microbatches in
    bf16 between the input halves where the schedule the function built does
    (``pipeline/halves.py``, read off its ``pipeline_order``)."""
    (outcome,) = runner.run([_plain("pp_zbv_reduce32")], ranks_executor(module_ranks))
    result = outcome.result
    assert (result.status, result.closeness) == ("pass", "bitwise"), result.reason
    assert "torch's ScheduleZBVZeroBubble over 4 microbatches, stages [0, 3] of 4 here" in result.candidate
