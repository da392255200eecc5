"""``make bench`` as data: the tables are rendered from the JSON it writes (so the gate can print
them again), a part that failed says why, and bad arguments exit 2. Nothing here measures time."""

import subprocess
import sys
from pathlib import Path

import pytest

from ci.bench import SCHEMA, render

ROOT = Path(__file__).resolve().parents[2]
SCALER_ROW = {
    "scaler": "GradScaler",
    "params": "10 x 4096",
    "floor_us": 8.0,
    "step_us": 7.0,
    "ours_us": 24.0,
    "torch_us": 40.0,
    "ours_per_floor": 3.0,
    "torch_per_floor": 5.0,
    "ours_per_torch": 0.6,
}
HARNESS = {
    "our_tests": 50,
    "mpc_tests": 5,
    "skipped_tests": 50,
    "ratio_mpc_per_ours": 1500.0,
    "ours_cold_s": 1.3,
    "ours_warm_mean_s": 0.003,
    "ours_warm_median_s": 0.003,
    "ours_wall_s": 5.0,
    "skipped_mean_s": 0.00006,
    "mpc_mean_s": 4.5,
    "mpc_wall_s": 28.0,
}


def _document(**parts):
    return {"schema": SCHEMA, "version": 1, "torch": "2.13.0", "cpus": 2, "created": "today", "parts": parts}


def test_every_part_renders_from_its_json():
    text = render(
        _document(
            scaler={"unit": "us", "rows": [SCALER_ROW]},
            harness=HARNESS,
            parity={"error": "RuntimeError: boom"},
        )
    )
    assert "GradScaler                     10 x 4096" in text and "0.60x" in text
    assert "ratio MultiProcessTestCase / harness (warm): 1500x" in text
    assert "parity matrix wall time: not measured: RuntimeError: boom" in text


def test_a_document_of_another_schema_is_refused():
    with pytest.raises(ValueError, match="not a shardscale.bench document"):
        render({"schema": "shardscale.parity"})


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--only", "gpu"], "argument --only: invalid choice: 'gpu'"),
        (["--json", "."], "--json . is a folder"),
        (["--cost-sizes", "5M"], "--cost-sizes '5M': give sizes of 1M, 10M, 50M, 185M, 300M"),
        (
            ["--cost-world-sizes", "1,2"],
            "--cost-world-sizes '1,2': give rank counts of 2 or more, e.g. 2,4,8",
        ),
        (["--cost-world-sizes", "two"], "--cost-world-sizes 'two': give rank counts of 2 or more"),
    ],
)
def test_bad_arguments_exit_2_naming_the_fix(args, complaint):
    done = subprocess.run(
        [sys.executable, "-m", "ci.bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and complaint in done.stderr, done.stderr


def test_the_distributed_test_case_rows_render_from_their_json():
    testcase = {"tests": 5, "ours_cold_s": 1.1, "ours_warm_mean_s": 0.005, "mpc_mean_s": 5.0}
    text = render(_document(harness={**HARNESS, "testcase": testcase}))
    assert "harness.DistributedTestCase (warm pool)                          5.0 ms      4" in text, text
    assert "MultiProcessTestCase                                          5000.0 ms      5" in text, text
    assert "ratio MultiProcessTestCase / DistributedTestCase (warm): 1000x" in text


def test_the_parity_part_says_what_each_recipes_rows_cost():
    parity = {
        "configs": 3,
        "broken": 0,
        "matrix_wall_s": 3.0,
        "per_config_warm_s": 1.0,
        "spawn_per_config_s": 5.0,
        "spawn_extrapolated_s": 15.0,
        "ratio_spawn_per_warm": 5.0,
        "spawn_sample": 3,
        "spawn_failures": [],
        "by_recipe": {"fp32": {"configs": 2, "time_s": 0.6}, "autocast-fp16": {"configs": 1, "time_s": 0.4}},
    }
    text = render(_document(parity=parity))
    assert "  fp32              2 rows    0.6 s ( 300 ms each,  60% of the matrix)" in text, text
    assert "  autocast-fp16     1 rows    0.4 s ( 400 ms each,  40% of the matrix)" in text, text


def test_the_parity_part_says_what_the_second_group_of_ranks_saves():
    parity = {
        "configs": 3,
        "broken": 0,
        "matrix_wall_s": 24.0,
        "jobs": 2,
        "one_group_wall_s": 42.0,
        "ratio_one_group_per_jobs": 1.75,
        "per_config_warm_s": 8.0,
        "spawn_per_config_s": 5.0,
        "spawn_extrapolated_s": 15.0,
        "ratio_spawn_per_warm": 0.6,
        "spawn_sample": 3,
        "spawn_failures": [],
    }
    text = render(_document(parity=parity))
    assert "on 2 groups of ranks at once (make parity); on one group (--jobs 1): 42.0 s, 1.75x" in text, text


def test_the_recipe_costs_are_counted_from_the_outcomes():
    from ci.bench.parity_wall import cost_by_recipe
    from harness.parity.doors.runner import Outcome
    from harness.parity.judge.result import ParityResult
    from harness.parity.plan.config import ParityConfig

    def outcome(**fields: object) -> Outcome:
        config = ParityConfig.from_flat(engine="fsdp2", **fields, reshard_after_forward=True)
        return Outcome(result=ParityResult(config=config, status="pass", profile="exact", time_s=0.5))

    found = cost_by_recipe([outcome(), outcome(precision="bf16"), outcome(precision="bf16", recipe="mixed")])
    assert found == {
        "fp32": {"configs": 1, "time_s": 0.5},
        "pure-bf16": {"configs": 1, "time_s": 0.5},
        "mixed-bf16": {"configs": 1, "time_s": 0.5},
    }


def test_the_parity_part_says_what_localization_costs_per_failing_configuration():
    parity = {
        "configs": 190,
        "broken": 0,
        "matrix_wall_s": 40.0,
        "per_config_warm_s": 0.2,
        "spawn_per_config_s": 5.0,
        "spawn_extrapolated_s": 950.0,
        "ratio_spawn_per_warm": 24.0,
        "spawn_sample": 6,
        "spawn_failures": [],
        "localization": {
            "failing_configs": 3,
            "judge_s": 0.4,
            "judge_and_localize_s": 0.65,
            "per_failing_config_s": 0.25,
            "ranks_rerun_s": 0.2,
            "total_s": 3.0,
        },
    }
    text = render(_document(parity=parity))
    assert "+250 ms per failing configuration (400 ms judged alone, 650 ms localized" in text
    assert "a passing matrix pays nothing" in text


def _side(name, wall_s, gb, processes=None):
    side = {"side": name, "status": "pass", "wall_s": wall_s, "peak_bytes": int(gb * 1024**3)}
    return {**side, "processes": processes or []}


def _row(size, world_size=2, function=False, **sides):
    from ci.bench import cost_curve

    found = {"size": size, "world_size": world_size, "steps": 6, "function": function, **sides}
    return cost_curve.ratios(found)


def _process(name, warm_gb, peak_gb):
    return {"process": name, "warm_bytes": int(warm_gb * 1024**3), "peak_bytes": int(peak_gb * 1024**3)}


def test_the_cost_curve_renders_from_its_json():
    measured = _row(
        "10M", single=_side("single", 1.0, 0.5), plain=_side("plain", 2.0, 1.0), tool=_side("tool", 4.0, 1.5)
    )
    failed = {
        "size": "50M",
        "world_size": 2,
        "single": _side("single", 1.0, 1.0),
        "plain": _side("plain", 1.0, 1.0),
    }
    failed["tool"] = {"side": "tool", "error": "exit 1: killed"}
    cost = {"model": "HF LlamaForCausalLM", "configuration": "fsdp2 fp32", "rows": [measured, failed]}
    text = render(_document(cost=cost))
    assert (
        "  10M     2       1.0        -      2.0      4.0    4.0x       -    2.0x    0.50    1.00    1.50    3.0x    1.5x  pass"
        in text
    ), text
    assert "  50M     2  not measured: the tool side exit 1: killed" in text, text


def test_the_cost_curve_reads_the_floor_against_one_process():
    """The floor (the candidate's training and its twin's arithmetic, nothing exchanged) over the
    single side's time: what no check on these ranks can go below, printed beside the check's."""
    sides = {"single": _side("single", 2.0, 0.5), "plain": _side("plain", 3.0, 1.0)}
    measured = _row("10M", floor=_side("floor", 3.8, 0.9), tool=_side("tool", 4.4, 1.5), **sides)
    assert measured["floor_time_ratio"] == pytest.approx(1.9)
    text = render(_document(cost={"model": "m", "configuration": "c", "rows": [measured]}))
    assert "     2.0      3.8      3.0      4.4    2.2x    1.9x    1.5x " in text, text


def test_a_floor_that_failed_leaves_the_row_measured_without_it():
    failed = {"side": "floor", "error": "exit 1: killed"}
    sides = {"single": _side("single", 2.0, 0.5), "plain": _side("plain", 3.0, 1.0)}
    measured = _row("10M", floor=failed, tool=_side("tool", 4.4, 1.5), **sides)
    assert "floor_time_ratio" not in measured and measured["single_time_ratio"] == pytest.approx(2.2)


def test_the_profile_splits_each_process_into_libraries_training_and_the_checks_own():
    plain = _side("plain", 2.0, 1.4, [_process("controller", 0.2, 0.2), _process("rank 0", 0.3, 1.2)])
    tool = _side("tool", 3.0, 1.8, [_process("controller", 0.2, 0.3), _process("rank 0", 0.3, 1.5)])
    cost = {
        "model": "m",
        "configuration": "c",
        "rows": [_row("10M", single=_side("single", 1.0, 0.6), plain=plain, tool=tool)],
    }
    text = render(_document(cost=cost))
    assert "  10M at 2 ranks (one process alone: 0.60 peak)" in text, text
    assert "rank 0:  0.30 |  0.90 | +0.30   peak  1.50" in text, text


def test_a_cost_curve_side_that_did_not_pass_is_not_measured():
    """A plain loop that missed its deadline has no peak memory worth a ratio (issue 25's 50M row
    once showed 0.21 GB for it)."""
    late = {
        "side": "plain",
        "status": "failed",
        "detail": "rank 0 did not finish",
        "wall_s": 60.0,
        "peak_bytes": 1,
    }
    found = _row("50M", single=_side("single", 1.0, 1.0), plain=late, tool=_side("tool", 2.0, 3.0))
    text = render(_document(cost={"model": "m", "configuration": "c", "rows": [found]}))
    assert "  50M     2  not measured: the plain side failed: rank 0 did not finish" in text, text


def test_the_cost_curves_sides_train_the_same_model():
    from ci.bench import cost_workloads
    from harness.parity.workload import registry

    pytest.importorskip("transformers")
    model = registry.build_model(registry.get(cost_workloads.spec("1M")), 0)
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 1.5e6


def test_the_cost_curve_draws_size_and_world_size_and_skips_what_was_not_measured(tmp_path):
    from ci.bench import cost_plot

    pytest.importorskip("matplotlib")
    sides = {
        "single": _side("single", 1.0, 1.0),
        "plain": _side("plain", 2.0, 2.0),
        "tool": _side("tool", 4.0, 3.0),
    }
    rows = [
        _row("1M", **sides),
        _row("1M", world_size=4, **sides),
        _row("1M", function=True, **sides),
        _row(
            "10M",
            function=True,
            single=sides["single"],
            plain=sides["plain"],
            tool={"side": "tool", "error": "x"},
        ),
    ]
    measured = {"configuration": "fsdp2 fp32, gloo ranks", "rows": rows}
    assert cost_plot.series(measured, "size") == {
        (False, "single_"): {"at": ["1M"], "time": [4.0], "memory": [3.0]},
        (False, ""): {"at": ["1M"], "time": [2.0], "memory": [1.5]},
        (True, "single_"): {"at": ["1M"], "time": [4.0], "memory": [3.0]},
        (True, ""): {"at": ["1M"], "time": [2.0], "memory": [1.5]},
    }
    assert cost_plot.series(measured, "world_size")[(False, "single_")]["at"] == [2, 4]
    measured["rows"][0] = _row("1M", floor=_side("floor", 1.5, 1.5), **sides)
    assert cost_plot.series(measured, "size")[(False, "floor_")] == {
        "at": ["1M"],
        "time": [1.5],
        "memory": [],
    }
    assert cost_plot.render_png(measured, tmp_path / "cost.png")
    assert (tmp_path / "cost.png").read_bytes()[:4] == b"\x89PNG"


def test_a_function_row_runs_the_users_function_on_the_plain_side_too():
    """Both sides of a function's row train the same model through the same function."""
    from ci.bench import cost_workloads
    from harness.parity.workload import registry

    pytest.importorskip("transformers")
    workload = registry.get(cost_workloads.spec("1M", function=True))
    assert workload.parallelize is cost_workloads.parallelize_llama and workload.optimizer is not None


def test_resolving_a_cost_workload_imports_its_model_so_no_sides_clock_pays_the_import():
    """Every side resolves its workload before its clock starts; transformers' Llama module takes
    0.7 to 1.7 s to import here, and a side that imported it inside its clock (the one process did,
    building its model) was charged for it. A fresh process: another test may have imported it."""
    pytest.importorskip("transformers")
    probe = (
        "import sys\n"
        "from ci.bench import cost_workloads\n"
        "from harness.parity.workload import registry\n"
        "name = 'transformers.models.llama.modeling_llama'\n"
        "before = name in sys.modules\n"
        "registry.get(cost_workloads.spec('1M', function=True))\n"
        "print(before, name in sys.modules, 'torch.distributed.algorithms._checkpoint' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[2]
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert found.stdout.split() == ["False", "True", "True"], found.stderr
