"""A user's own ``parallelize`` function as the candidate: its rows, its mesh, what the engine reads
off the modules it returns, and the verdicts on correct and planted functions
(``fixtures/user_functions.py``; the compiled ones run in the compile tier, at world size 4 in the
world-size tier)."""

from __future__ import annotations

import pytest

from harness.parity.doors import runner
from harness.parity.plan.config import Compile, Layout, Mesh, ParityConfig
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from harness.parity.report import markdown
from suites.parity.support import ranks_executor

_FUNCTIONS = "fixtures.user_functions"
_CORRECT = (
    "per_block",
    "bf16_fp32_reduce",
    "unit_policies",
    "float32_root",
    "keep_last",
    "checkpointed",
    "fused",
)
_PLANTS = {
    "retied_after": "split_tie",
    "root_unsharded": "never_reduced",
    "divide_twice": "divide_factor",
    "checkpoint_no_rng": "checkpoint_rng",
    "rank0_init": "forward_differs",
}
"""Each planted function and the known cause its row must name."""


def _config(function: str, **fields: object) -> ParityConfig:
    (config,) = [
        c for c in workload_matrix.for_workload(f"{_FUNCTIONS}:{function}_workload", **fields) if not c.faults
    ][:1]
    return config


def test_a_workload_with_a_function_gets_its_setup_as_rows_not_the_matrix():
    configs = workload_matrix.for_workload(f"{_FUNCTIONS}:per_block_workload", declared=Declared(clip=0.5))
    assert [c.id for c in configs] == [
        "user-dp2-own-per_block-w2",
        "user-dp2-own-per_block-inf@r1s2-w2",
        "user-dp2-own-per_block-inf@alls2-w2",
        "user-dp2-own-per_block-unscale_clip-clip0.5-w2",
    ]
    assert {c.engine for c in configs} == {"user"}


def test_a_resume_row_saves_and_loads_the_functions_model_and_trains_on_bitwise(module_ranks):
    (config,) = [
        c
        for c in workload_matrix.for_workload(
            f"{_FUNCTIONS}:bf16_fp32_reduce_workload", declared=Declared(resume_at=2)
        )
        if c.resume.at is not None
    ]
    assert config.id == "user-dp2-own-bf16_fp32_reduce-resume@2-dcp-w2"
    (outcome,) = runner.run([config], ranks_executor(module_ranks))
    assert (outcome.result.status, outcome.result.closeness) == ("pass", "bitwise"), outcome.result.reason
    assert "saved after step 1, resumed in your bf16_fp32_reduce()" in outcome.result.candidate


def test_the_mesh_is_the_users_names_and_sizes():
    (config, *_) = workload_matrix.for_workload(
        f"{_FUNCTIONS}:per_block_workload", world_size=4, mesh="dp_shard=2,tp=2"
    )
    assert config.mesh.dims == (("dp_shard", 2), ("tp", 2))
    assert config.id.startswith("user-dp_shard2xtp2-")
    assert [config.mesh.data_rank(r) for r in range(4)] == [0, 0, 1, 1]  # a TP pair shares a batch
    assert config.mesh.data_parallel_size(4) == 2


def test_a_mesh_the_world_cannot_hold_is_refused_naming_the_sizes():
    with pytest.raises(ValueError, match="holds 3 ranks, not the world size 2"):
        ParityConfig(engine="user", workload=f"{_FUNCTIONS}:per_block_workload", mesh=Mesh(dims=(("dp", 3),)))


def test_a_mesh_flag_that_is_not_name_size_pairs_names_the_flag():
    with pytest.raises(ValueError, match="--mesh takes name=size pairs"):
        Mesh.parse("dp2")


def test_an_eager_twin_is_one_more_row_of_the_function():
    configs = workload_matrix.for_workload(f"{_FUNCTIONS}:compiled_after_workload", compile_twin="eager")
    assert configs[-1].id == "user-dp2-own-compiled_after-eager_twin-w2"
    assert configs[-1].compile.twin == "eager" and configs[-1].reference_key() != configs[0].reference_key()


def test_compile_as_the_function_does_is_for_user_functions_only():
    with pytest.raises(ValueError, match="compile='function' is a user's parallelize function"):
        ParityConfig(
            engine="fsdp2",
            layout=Layout(reshard_after_forward=True),
            compile=Compile(mode="function", twin="eager"),
        )


def test_engine_user_without_a_function_names_the_fix():
    with pytest.raises(ValueError, match="Workload\\(parallelize=my_parallelize\\)"):
        ParityConfig(engine="user", workload="mlp", mesh=Mesh(dims=(("dp", 2),)))


@pytest.mark.parametrize(
    ("backend", "words"),
    [
        ("gloo", "does not have a sharding strategy registered"),  # torch's own reason, on CPU
        ("nccl", "check the rest of your layout with the cp ranks given to dp"),
    ],
)
def test_a_context_parallel_dimension_is_refused_naming_why_and_the_way_on(backend, words):
    with pytest.raises(ValueError, match="'cp' mesh dimension") as refused:
        ParityConfig(
            engine="user", workload=f"{_FUNCTIONS}:per_block_workload", world_size=4, backend=backend,
            mesh=Mesh(dims=(("cp", 2), ("dp", 2))),
        )  # fmt: skip
    assert words in str(refused.value)


@pytest.fixture(scope="module")
def verdicts(module_ranks) -> dict[str, runner.Outcome]:
    """Every correct and planted function's plain row at world size 2, run once for the module."""
    names = (*_CORRECT, *_PLANTS)
    outcomes = runner.run([_config(name) for name in names], ranks_executor(module_ranks))
    return {o.result.config.workload.split(":")[1].removesuffix("_workload"): o for o in outcomes}


@pytest.mark.parametrize("function", _CORRECT)
def test_a_correct_function_trains_bitwise_like_its_unsharded_twin(verdicts, function):
    result = verdicts[function].result
    assert (result.status, result.closeness) == ("pass", "bitwise"), result.reason


@pytest.mark.parametrize("function", sorted(_PLANTS))
def test_a_planted_function_fails_at_step_0_with_its_cause_named(verdicts, function):
    result = verdicts[function].result
    assert result.status == "fail", result.reason
    assert result.divergences[0].step == 0
    assert _PLANTS[function] in {cause.name for cause in result.causes}


def test_the_report_says_what_the_function_did_per_module(verdicts):
    lines = markdown.your_parallelization(
        [verdicts["root_unsharded"].result, verdicts["checkpoint_no_rng"].result]
    )
    text = "\n".join(lines)
    assert "## Your parallelization: your root_unsharded() on mesh `dp=2`" in text
    assert "- layers.0: fully_shard over dp 2, 2 parameters, float32, reshard after forward" in text
    assert "never reduced: embed.weight, norm.weight, norm.bias" in text
    assert "- layers.1: activation checkpointing WITHOUT preserve_rng_state" in text
    assert "no activation checkpointing" in text  # the twin drops it, and says so


def test_the_policy_is_read_off_the_units_and_emulated_by_the_twin(verdicts):
    result = verdicts["bf16_fp32_reduce"].result
    assert "MixedPrecisionPolicy param bf16, reduce fp32" in result.candidate
    assert "a working copy in your units' policies (bf16/fp32: parameter/reduce dtypes)" in result.reference


@pytest.mark.compile
@pytest.mark.parametrize(
    "function", ["compiled_after", "compiled_before", "compiled_whole", "torchtitan_like", "compiled_ddp"]
)
def test_a_compiled_function_trains_bitwise_like_its_twin_compiled_alike(module_ranks, function):
    (outcome,) = runner.run([_config(function)], ranks_executor(module_ranks))
    assert (outcome.result.status, outcome.result.closeness) == ("pass", "bitwise"), outcome.result.reason
    assert "compiled as yours" in outcome.result.reference


@pytest.mark.compile
def test_an_eager_twin_shows_inductors_own_difference_named(module_ranks):
    config = workload_matrix.for_workload(f"{_FUNCTIONS}:inductor_workload", compile_twin="eager")[-1]
    (outcome,) = runner.run([config], ranks_executor(module_ranks))
    assert outcome.result.status == "fail"
    assert outcome.result.causes[0].name == "compile_changes_numerics", outcome.explanation


@pytest.mark.world_sizes
@pytest.mark.parametrize("degree", [2, 4])
def test_a_tp_plan_inside_the_function_is_mirrored(module_ranks, degree):
    config = _config("tensor_parallel", world_size=4, mesh=f"dp={4 // degree},tp={degree}")
    (outcome,) = runner.run([config], ranks_executor(module_ranks))
    assert (outcome.result.status, outcome.result.closeness) == ("pass", "bitwise"), outcome.result.reason
    assert f"ColwiseParallel over tp {degree}" in outcome.result.candidate


def test_a_correct_function_is_bitwise_at_world_size_4(module_ranks):
    """From 3 ranks on the order of summation is the ring's: the twin must reduce in the units'
    buckets through the same collective for the bits to match."""
    (outcome,) = runner.run([_config("bf16_fp32_reduce", world_size=4)], ranks_executor(module_ranks))
    assert (outcome.result.status, outcome.result.closeness) == ("pass", "bitwise"), outcome.result.reason


@pytest.mark.world_sizes
@pytest.mark.parametrize("function", ["root_unsharded", "divide_twice"])
def test_at_world_size_4_the_plants_fail_named(module_ranks, function):
    (outcome,) = runner.run([_config(function, world_size=4)], ranks_executor(module_ranks))
    assert outcome.result.status == "fail", outcome.result.reason
    assert _PLANTS[function] in {cause.name for cause in outcome.result.causes}


@pytest.mark.e2e
def test_torchrun_checks_a_function_on_the_mesh_it_is_given(tmp_path):
    """Every launched process a rank, ``--mesh`` naming the function's mesh (seconds)."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "harness.parity"]
        + ["--workload", f"{_FUNCTIONS}:bf16_fp32_reduce_workload", "--mesh", "dp=2", "--no-plot"]
        + ["--out", str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "pass  user-dp2-own-bf16_fp32_reduce-w2" in done.stdout
    assert (
        "## Your parallelization: your bf16_fp32_reduce() on mesh `dp=2`"
        in (tmp_path / "parity.md").read_text()
    )


def test_a_context_parallel_dimension_on_cpu_is_refused_naming_torchs_reason():
    with pytest.raises(ValueError, match="does not have a sharding strategy registered") as refused:
        ParityConfig(
            engine="user", workload=f"{_FUNCTIONS}:per_block_workload", world_size=4,
            mesh=Mesh(dims=(("cp", 2), ("dp", 2))),
        )  # fmt: skip
    assert "--backend nccl" in str(refused.value)
