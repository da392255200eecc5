"""A user's own ``parallelize`` function over a real Hugging Face Llama: its rows pass bitwise or
``staged`` (the clip row: clipping's norm sums otherwise under sharding, and the staged check
judges it), and the same function with the root forgotten crashes in the optimizer (foreach AdamW
over DTensors and plain tensors) with the cause named ``never_reduced``. ``make
test`` runs the clip row and the plant at world size 2; ``make models`` every row at 2 and 4. A
user's own pipeline over Llama (their cut, their stages, 1F1B): every row at pp 2 and pp 2 x dp 2
in ``make pipeline``."""

import pytest

from suites.models.support import FULL, INSTALL_HINT

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)

from harness.parity.doors import runner  # noqa: E402
from harness.parity.plan.matrices import workload as workload_matrix  # noqa: E402
from suites.parity.support import ranks_executor  # noqa: E402

_FUNCTION = "suites.models.workloads:llama_function"
_SIZES = [2, 4] if FULL else [2]


@pytest.mark.parametrize("world_size", _SIZES)
def test_a_users_function_over_llama_passes_bitwise_or_staged(module_ranks, world_size):
    configs = workload_matrix.for_workload(_FUNCTION, world_size=world_size)
    if not FULL:
        configs = [c for c in configs if c.loop.path == "unscale_clip"]
    outcomes = runner.run(configs, ranks_executor(module_ranks))
    for outcome in outcomes:
        result = outcome.result
        assert result.status == "pass" and result.closeness in ("bitwise", "staged"), (
            result.config.id,
            result.reason,
        )
    clipped = [o.result for o in outcomes if o.result.config.loop.path == "unscale_clip"]
    assert [r.closeness for r in clipped] == ["staged"], "the clip row needs the staged check"


def test_the_function_without_its_root_is_named_never_reduced(module_ranks):
    (config, *_) = workload_matrix.for_workload("suites.models.workloads:llama_function_without_root")
    (outcome,) = runner.run([config], ranks_executor(module_ranks))
    assert outcome.result.status == "crash"  # foreach AdamW over DTensors and plain tensors raises
    assert "never_reduced" in {cause.name for cause in outcome.result.causes}, outcome.explanation


_PIPELINE = "suites.models.workloads:llama_pipeline_function"


@pytest.mark.pipeline
@pytest.mark.parametrize(("world_size", "mesh"), [(2, "pp=2,dp=1"), (4, "pp=2,dp=2")])
def test_a_users_own_pipeline_over_llama_passes_bitwise(module_ranks, world_size, mesh):
    """The user cuts the Hugging Face model into stages themselves (a copy keeping its names, the
    other stages' layers skipped, a forward on tokens or hidden states), shards each and builds
    1F1B: the whole model's twin runs the same microbatches and every row is bitwise."""
    configs = workload_matrix.for_workload(_PIPELINE, world_size=world_size, mesh=mesh)
    for outcome in runner.run(configs, ranks_executor(module_ranks)):
        result = outcome.result
        assert (result.status, result.closeness) == ("pass", "bitwise"), (result.config.id, result.reason)
        assert "torch's Schedule1F1B over 2 microbatches" in result.candidate
