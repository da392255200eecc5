"""Localization finds the planted bug: for each bug planted into the candidate only (a block that
behaves differently when sharded, a 1-ulp change in one named layer under FSDP2, a scaler without
found_inf agreement, gradients off by the world size), the report names the right step, module
and known cause. The plants live in ``fixtures/parity_plants.py``; the shipped engine has none.
"""

import pytest

from fixtures.parity_plants import Plant, planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import Fault, Layout, ParityConfig, Precision, Scale
from harness.parity.report import markdown, render

_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True, "optimizer": "sgd", "steps": 3}
CASES = {
    "block_fp32": (
        ParityConfig.from_flat(workload="transformer", **_FSDP2),
        Plant(kind="output_scale", module="blocks.1", amount=1e-2),
    ),
    "block_bf16": (
        ParityConfig.from_flat(workload="transformer", **_FSDP2, precision="bf16"),
        Plant(kind="output_scale", module="blocks.1", amount=1e-2),
    ),
    "block_fsdp1_fp16": (
        ParityConfig(
            engine="fsdp1",
            workload="transformer",
            optimizer="sgd",
            steps=3,
            layout=Layout(sharding="full_shard", use_orig_params=False),
            precision=Precision(dtype="fp16"),
        ),
        Plant(kind="output_scale", module="blocks.1", amount=1e-2),
    ),
    "one_ulp": (
        ParityConfig.from_flat(**_FSDP2),
        Plant(kind="output_ulp", module="inner.1.linear", amount=1),
    ),
    "one_ulp_bf16": (
        ParityConfig.from_flat(**_FSDP2, precision="bf16"),
        Plant(kind="output_ulp", module="inner.1.linear", amount=1),
    ),
    "op_in_float64": (
        ParityConfig.from_flat(**_FSDP2),
        Plant(kind="linear_in_float64", module="inner.0.linear"),
    ),
    "no_agreement": (
        ParityConfig(
            suite="forced_inf",
            engine="fsdp1",
            faults=(Fault(step=2, rank=1),),
            steps=4,
            layout=Layout(sharding="full_shard", use_orig_params=False),
            scale=Scale(init_scale=1024.0),
        ),
        Plant(kind="no_agreement"),
    ),
    "divide_factor": (ParityConfig.from_flat(**_FSDP2), Plant(kind="grad_factor", amount=2.0)),
    "buffer_cast_by_hand": (
        ParityConfig.from_flat(workload="fixtures.policy_workload:policy_net", **_FSDP2, precision="bf16"),
        Plant(kind="cast_buffer", module="rotary.freq"),
    ),
}


@pytest.fixture(scope="module")
def planted(module_ranks):
    """``{case: ParityResult}``: each case's configuration run with its plant in the candidate."""
    found = {}
    for name, (config, plant) in CASES.items():
        (outcome,) = runner.run([config], planted_executor(module_ranks, plant))
        found[name] = outcome.result
    return found


def _first(result):
    assert result.status == "fail", f"{result.config.id}: {result.status} {result.reason}"
    assert result.localization is not None and not result.localization.error, result.localization
    return result.localization.first


def _cause_names(result):
    return [cause.name for cause in result.causes]


@pytest.mark.parametrize("case", ["block_fp32", "block_bf16", "block_fsdp1_fp16"])
def test_a_block_that_behaves_differently_when_sharded_is_located_to_that_block(planted, case):
    result = planted[case]
    first = _first(result)
    assert (first.module, first.phase, first.rank, result.localization.step) == ("blocks.1", "forward", 0, 0)
    assert "forward_differs" in _cause_names(result)


def test_fsdp1_wrapper_prefixes_never_appear_in_module_names(planted):
    names = {m.module for m in planted["block_fsdp1_fp16"].localization.modules}
    assert "blocks.1.attn.qkv" in names
    assert not any("_fsdp_wrapped_module" in name or name.startswith("module.") for name in names)


def test_its_neighbours_and_children_are_reported_as_matching(planted):
    located = planted["block_fp32"].localization
    forward = {m.module: m for m in located.along() if m.phase == "forward"}
    assert not forward["blocks.0"].failed and not forward["blocks.1.mlp"].failed
    assert not forward["blocks.1.attn"].failed and forward["norm"].failed


@pytest.mark.parametrize("case", ["one_ulp", "one_ulp_bf16"])
def test_a_one_ulp_change_in_one_layers_output_under_fsdp2_is_located_to_that_layer(planted, case):
    first = _first(planted[case])
    assert (first.module, first.phase, first.max_ulp) == ("inner.1.linear", "forward", 1.0)
    assert planted[case].first_diverging_step == 0


def test_inside_the_first_diverging_module_the_first_diverging_op_is_named(planted):
    located = planted["op_in_float64"].localization
    assert (located.first.module, located.first.phase) == ("inner.0.linear", "forward")
    assert located.op.first == "aten.addmm.default", located.op
    assert "inside it, first diverging op: aten.addmm.default" in located.describe()


def test_a_change_made_by_a_hook_after_the_modules_own_ops_is_told_apart(planted):
    """The 1-ulp plant is a forward hook: the module's own ops match the reference's."""
    op = planted["one_ulp"].localization.op
    assert op.first == "" and op.compared > 0
    assert "its output changes after them (a forward hook, or the wrapper)" in op.describe()


def test_a_scaler_without_found_inf_agreement_is_named_at_the_poisoned_step(planted):
    result = planted["no_agreement"]
    assert result.first_diverging_step == 2 and result.divergences[0].what == "agreement"
    assert _cause_names(result) == ["skip_desync"]
    assert _first(result) is None  # forward and backward match: it happens after backward
    assert "the difference arises after backward" in result.localization.describe()


def test_gradients_off_by_the_world_size_are_named_as_a_divide_factor_mismatch(planted):
    result = planted["divide_factor"]
    assert result.first_diverging_step == 0
    assert _cause_names(result) == ["divide_factor"]
    assert "every gradient is 2x the reference's (the world size, 2" in result.causes[0].evidence
    assert _first(result) is None


def test_a_buffer_cast_by_hand_on_one_side_is_named_with_both_dtypes_in_its_module(planted):
    result = planted["buffer_cast_by_hand"]
    assert _first(result).module == "rotary"
    (cause,) = [c for c in result.causes if c.name == "dtype_differs"]
    assert (
        "in the first diverging module rotary, rotary.freq is bfloat16 in the candidate and float32 in the reference"
        in (cause.describe())
    )


def test_the_markdown_report_carries_the_module_and_the_cause_in_the_row_and_divergences(planted):
    text = markdown.render_markdown([planted["block_fp32"]], {"backend": "gloo", "world_size": 2})
    row = next(line for line in text.splitlines() if line.startswith("| `fsdp2"))
    assert "| 0 (blocks.1, forward, rank 0) |" in row
    assert "  - first diverging module: blocks.1, forward output, step 0, rank 0: abs " in text
    assert "  - known cause (forward_differs): the loss differs already at step 0" in text


def test_the_json_report_holds_every_module_compared(planted):
    data = render.result_to_json(planted["one_ulp"])
    located = data["localization"]
    assert located["first"]["module"] == "inner.1.linear"
    modules = {(m["phase"], m["module"]) for m in located["modules"]}
    assert {("forward", "inp.linear"), ("forward", ""), ("backward", "out")} <= modules


def test_the_figure_draws_the_failing_configurations_in_detail(planted, tmp_path):
    from harness.parity.report.plot import render_png

    assert render_png(list(planted.values()), tmp_path / "parity.png")
    assert (tmp_path / "parity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
