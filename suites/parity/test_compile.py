"""``torch.compile`` on both sides (``--compile``): the part, its rows, the CLI, and a fixed
sample compiled with ``aot_eager`` (seconds), each side measured to have run compiled modules.
Inductor's rows are ``make compile``'s (``test_compile_tier.py``), and so is the sample's row
compiled whole (marked ``compile``)."""

import pytest
from torch import nn

from fixtures.parity_records import replace_step, run, step
from harness.parity.doors import runner
from harness.parity.judge import causes
from harness.parity.judge.compare import compare_runs
from harness.parity.judge.result import ParityResult
from harness.parity.plan import profiles
from harness.parity.plan.config import Compile, Layout, Loop, ParityConfig
from harness.parity.plan.matrices import compile as compile_matrix
from harness.parity.ranks.sides import compiled
from harness.parity.report import markdown, render
from harness.parity.workload.builtin import toys
from suites.parity.support import cli_in_process, describe, ranks_executor

_FSDP2 = ParityConfig(
    engine="fsdp2",
    layout=Layout(reshard_after_forward=True),
    compile=Compile(mode="block", backend="aot_eager"),
)


def test_compiling_is_named_in_the_id_and_its_backend_unless_inductor():
    assert _FSDP2.id == "fsdp2-reshard-fp32-sgd-compile_block-aot_eager-w2"
    assert _FSDP2.with_(compile=Compile(mode="whole")).id == "fsdp2-reshard-fp32-sgd-compile_whole-w2"
    assert "compile" not in _FSDP2.with_(compile=Compile()).id


def test_compile_is_selected_by_its_words_and_flat_names():
    assert {"compiled", "compile_block", "compile=block", "compile_backend=aot_eager"} <= _FSDP2.keywords
    assert "compiled" not in _FSDP2.with_(compile=Compile()).keywords


def test_a_compiled_rows_flat_fields_read_back_as_the_same_row():
    assert ParityConfig.from_flat(**_FSDP2.flat()) == _FSDP2


def test_each_mode_and_backend_has_a_reference_of_its_own():
    keys = {
        _FSDP2.with_(compile=part).reference_key()
        for part in (Compile(), Compile(mode="block"), Compile(mode="whole"), _FSDP2.compile)
    }
    assert len(keys) == 4


def test_an_eager_twin_is_the_eager_rows_reference():
    eager_twin = _FSDP2.with_(compile=Compile(mode="block", twin="eager"))
    assert eager_twin.id.endswith("-compile_block-eager_twin-w2")
    assert eager_twin.reference_key() == _FSDP2.with_(compile=Compile()).reference_key()


def test_candidates_compiled_alike_share_their_twin():
    orig = _FSDP2.with_(engine="fsdp1", layout=Layout(sharding="full_shard", use_orig_params=True))
    flat = orig.with_(use_orig_params=False)
    assert orig.reference_key() == flat.reference_key()


def test_a_backend_without_a_mode_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match="needs a compile mode"):
        Compile(backend="aot_eager")


def test_an_unknown_mode_is_refused_naming_the_allowed_ones():
    with pytest.raises(ValueError, match=r"compile must be one of \(None, 'block', 'whole', 'function'\)"):
        Compile(mode="blocks")


def test_compile_with_checkpointing_is_refused_as_not_mirrored():
    with pytest.raises(ValueError, match="activation checkpointing is not mirrored"):
        _FSDP2.with_(loop=Loop(checkpoint="replay"))


def test_per_block_compiles_the_innermost_units_not_the_unit_around_them():
    model = toys.NestedMLP()
    found = compiled.targets(model, (toys.Block, nn.Sequential), "block", workload="mlp")
    assert found == [model.inp, *model.inner]


def test_whole_compiles_the_model_itself():
    model = toys.NestedMLP()
    assert compiled.targets(model, (toys.Block,), "whole", workload="mlp") == [model]


def test_per_block_needs_units():
    with pytest.raises(ValueError, match="compile='block' compiles the FSDP units"):
        compiled.targets(toys.NestedMLP(), (), "block", workload="flat")


def test_a_compiled_module_is_counted_and_an_eager_one_is_not():
    model = toys.NestedMLP()
    compiled.apply([model.inp], backend="aot_eager")
    assert compiled.compiled_modules(model) == 1


def test_the_compiled_rows_cover_every_engine_and_ddp_in_float32_only():
    rows = compile_matrix.rows(mode="block")
    assert {(c.engine, c.layout.use_orig_params) for c in rows} == {
        ("ddp", None),
        ("fsdp1", False),
        ("fsdp1", True),
        ("fsdp2", None),
    }
    assert {c.precision.dtype for c in rows if c.engine == "ddp"} == {"fp32"}
    assert len(rows) == 14 and all(c.compile == Compile(mode="block") for c in rows)


def test_the_cli_lists_the_compiled_rows_with_the_backend_asked_for():
    done = cli_in_process("--compile", "whole", "--compile-backend", "aot_eager", "--list")
    assert done.returncode == 0, done.stderr
    ids = [line for line in done.stdout.splitlines() if line.endswith("-compile_whole-aot_eager-w2")]
    assert len(ids) == 14


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--compile", "blocks"), "--compile must be one of block, whole, got 'blocks'"),
        (
            ("--compile", "block", "--compile-backend", "eager"),
            "--compile-backend must be one of inductor, aot_eager",
        ),
        (("--compile-backend", "aot_eager"), "--compile-backend aot_eager needs --compile MODE"),
        (("--compile", "block", "--reshard"), "--compile runs the compiled rows; not with --reshard"),
        (("--compile", "block", "--compile-twin", "none"), "--compile-twin must be one of compiled, eager"),
    ],
    ids=["mode", "backend", "backend_alone", "reshard", "twin"],
)
def test_the_cli_refuses_a_bad_compile_flag_naming_it(args, message):
    done = cli_in_process(*args, "--list")
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_the_reports_say_what_compiling_cost_each_side():
    result = ParityResult(
        config=_FSDP2, status="pass", profile="exact", compile_s={"reference": 1.5, "candidate": 0.25}
    )
    assert render.result_to_json(result)["compile_s"] == {"reference": 1.5, "candidate": 0.25}
    text = markdown.render_markdown([result], {"compile_cache": "/tmp/cache"})
    assert "reference 1.50s, candidate 0.25s" in text and "`/tmp/cache`" in text
    assert "compiled block, aot_eager" in text


def _named(reference_compiled, candidate_compiled):
    ref = run(replace_step(step(0), compiled=reference_compiled))
    cand = run(replace_step(step(0, grad=0.5), compiled=candidate_compiled))
    return [c.name for c in causes.match(ref, cand, compare_runs(ref, cand, profile=profiles.EXACT))]


def test_gradients_differing_from_an_eager_twin_are_named_compile_changes_numerics():
    assert "compile_changes_numerics" in _named(None, "3 modules, inductor")


def test_gradients_differing_from_a_twin_compiled_alike_are_not_compiles():
    assert "compile_changes_numerics" not in _named("3 modules, inductor", "3 modules, inductor")


_STEPS = 2
"""The sample's steps: step 0 compiles and step 1 runs the compiled graphs again (a cache hit),
which is what a compiled row can show; the matrix's 4 steps only add eager-speed steps."""
_EAGER_TWIN = _FSDP2.with_(
    optimizer="adamw", steps=_STEPS, compile=Compile(mode="block", backend="aot_eager", twin="eager")
)
_SAMPLE = {
    config.id: config
    for config in [
        *(c.with_(steps=_STEPS) for c in compile_matrix.sample() if c.compile.mode == "block"),
        _EAGER_TWIN,
    ]
}
"""What ``make test`` compiles: FSDP2 per block against its compiled twin and its eager twin."""
_WHOLE = {c.id: c.with_(steps=_STEPS) for c in compile_matrix.sample() if c.compile.mode == "whole"}
"""FSDP1 (original parameters) compiled whole with ``aot_eager``: the ``compile`` tier's, which
also compiles every engine whole with inductor (``make compile``); its graph of the whole model is
most of the sample's compile time on two cores."""


def _run(module_ranks, rows: dict) -> dict:
    outcomes = runner.run(list(rows.values()), ranks_executor(module_ranks), localize=False)
    return dict(zip(rows, outcomes, strict=True))


@pytest.fixture(scope="module")
def sampled(module_ranks):
    """``{id: Outcome}`` of the ``aot_eager`` sample."""
    return _run(module_ranks, _SAMPLE)


@pytest.fixture(scope="module")
def whole(module_ranks):
    """``{id: Outcome}`` of the rows compiled whole (the ``compile`` tier)."""
    return _run(module_ranks, _WHOLE)


_TWINNED = [row for row, config in _SAMPLE.items() if config.compile.twin == "compiled"]
_TWINNED_PARAMS = [
    *(pytest.param("sampled", row, id=row) for row in _TWINNED),
    *(pytest.param("whole", row, id=row, marks=pytest.mark.compile) for row in _WHOLE),
]


def test_the_sample_compiles_per_block_and_the_tier_whole():
    assert [c.compile.mode for c in _SAMPLE.values()] == ["block", "block"]
    assert [c.compile.mode for c in _WHOLE.values()] == ["whole"]
    assert {c.steps for c in [*_SAMPLE.values(), *_WHOLE.values()]} == {_STEPS}


@pytest.mark.parametrize(("rows", "row"), _TWINNED_PARAMS)
def test_a_compiled_candidate_trains_bitwise_like_its_compiled_twin(request, rows, row):
    outcome = request.getfixturevalue(rows)[row]
    assert outcome.passed, describe(outcome)
    assert outcome.result.closeness == "bitwise"


@pytest.mark.parametrize(("rows", "row"), _TWINNED_PARAMS)
def test_both_sides_ran_compiled_modules_and_say_what_it_cost(request, rows, row):
    """Measured off each side's modules (``compiled.recorded``): a side left eager has no cost."""
    assert set(request.getfixturevalue(rows)[row].result.compile_s) == {"reference", "candidate"}


def test_aot_eager_keeps_eagers_rounding_so_an_eager_twin_stays_bitwise(sampled):
    outcome = sampled[_EAGER_TWIN.id]
    assert outcome.passed, describe(outcome)
    assert outcome.result.closeness == "bitwise" and set(outcome.result.compile_s) == {"candidate"}


def test_each_step_records_what_ran_compiled_on_each_side(sampled):
    outcome = sampled[_EAGER_TWIN.id]
    assert {s.compiled for s in outcome.candidate.steps} == {"3 modules, aot_eager"}
    assert {s.compiled for s in outcome.reference.steps} == {None}
