"""``torch.compile`` with inductor (``make compile``, ``-m compile``): the transformer, whose
LayerNorm, softmax and GELU inductor fuses, trains bitwise like its twin compiled the same way, and
differs from an eager twin from step 0, where ``compile_changes_numerics`` names compile's own
difference. (The whole tier's rows run as ``--compile block|whole``; ``make test`` runs an
``aot_eager`` sample, ``test_compile.py``.)"""

import pytest

from harness.parity.doors import runner
from harness.parity.plan.matrices import compile as compile_matrix
from suites.parity.support import describe, ranks_executor

pytestmark = pytest.mark.compile


def _row(mode: str, engine: str, twin: str = "compiled", orig: bool | None = None):
    (config,) = [
        c
        for c in compile_matrix.rows(mode=mode, twin=twin, workload="transformer")
        if c.engine == engine
        and c.precision.dtype == "fp32"
        and c.optimizer == "adamw"
        and (orig is None or c.layout.use_orig_params is orig)
    ]
    return config


_ROWS = {
    "fsdp2_block": _row("block", "fsdp2"),
    "fsdp2_whole": _row("whole", "fsdp2"),
    "fsdp1_orig_whole": _row("whole", "fsdp1", orig=True),
    "fsdp2_block_eager_twin": _row("block", "fsdp2", twin="eager"),
}


@pytest.fixture(scope="module")
def inductor(module_ranks):
    """``{name: Outcome}`` of :data:`_ROWS`, compiled with inductor."""
    outcomes = runner.run(list(_ROWS.values()), ranks_executor(module_ranks), localize=False)
    return dict(zip(_ROWS, outcomes, strict=True))


def test_the_tier_compiles_a_model_inductor_fuses():
    assert "transformer" in compile_matrix.TIER_WORKLOADS


@pytest.mark.parametrize("name", ["fsdp2_block", "fsdp2_whole"])
def test_an_inductor_candidate_trains_bitwise_like_its_inductor_twin(inductor, name):
    outcome = inductor[name]
    assert outcome.passed, describe(outcome)
    assert outcome.result.closeness == "bitwise"


def test_an_inductor_fsdp1_candidate_holds_at_every_stage_where_not_bitwise(inductor):
    """FSDP1 swaps each unit's parameters for views of its flat parameter, so dynamo may trace
    another graph than the twin's, which inductor may round otherwise: measured, one ulp in one
    rank's loss at step 0 in some runs (bitwise in others), every stage held from a common state."""
    outcome = inductor["fsdp1_orig_whole"]
    assert outcome.passed, describe(outcome)
    assert outcome.result.closeness in ("bitwise", "staged")


def test_an_inductor_candidate_differs_from_an_eager_twin_from_step_0(inductor):
    result = inductor["fsdp2_block_eager_twin"].result
    assert result.status == "fail" and result.first_diverging_step == 0


def test_an_eager_twins_difference_is_named_compile_changes_numerics_first(inductor):
    assert [c.name for c in inductor["fsdp2_block_eager_twin"].result.causes][:1] == [
        "compile_changes_numerics"
    ]


def test_only_the_compiled_side_of_an_eager_twin_row_has_a_compile_cost(inductor):
    assert set(inductor["fsdp2_block_eager_twin"].result.compile_s) == {"candidate"}
