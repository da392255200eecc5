"""Every recipe trains like its unsharded twin, bitwise at world size 2 on gloo, and a twin that
forgets the recipe's autocast fails with the known cause that says so.

The default matrix's recipe rows (``matrix.recipes``): ``{fp16,bf16}-reduce32``, ``autocast-*`` and
``mixed-*`` under FSDP1 FULL_SHARD and FSDP2 on the MLP, and the autocasting ones on the tied-weight
transformer (LayerNorm, softmax and cross-entropy, which autocast upcasts to float32).
"""

import pytest

from fixtures.parity_plants import Plant, planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import ParityConfig
from harness.parity.plan.matrices import default as matrix
from suites.parity.support import describe

CONFIGS = matrix.recipes(world_size=2)

_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True, "optimizer": "sgd", "steps": 3}
FORGOTTEN = {
    "autocast_fp16_mlp": ParityConfig.from_flat(**_FSDP2, recipe="autocast", precision="fp16"),
    "mixed_fp16_raw_logits": ParityConfig.from_flat(
        workload="fixtures.recipe_workloads:resmlp_raw_logits",
        **_FSDP2,
        recipe="mixed",
        precision="fp16",
    ),
}


def test_each_recipe_trains_like_its_twin_bitwise(parity_config, outcome):
    result = outcome.result
    assert result.status == "pass", describe(outcome)
    assert result.closeness == "bitwise", result.closeness


def test_each_recipe_row_names_its_recipe_in_what_ran(parity_config, outcome):
    if parity_config.precision.autocast is not None:
        assert "torch.autocast" in outcome.result.reference and "torch.autocast" in outcome.result.candidate


@pytest.fixture(scope="module")
def forgotten(module_ranks):
    """``{case: ParityResult}`` against a reference that runs its forward without autocast."""
    plant = Plant(kind="reference_without_autocast")
    outcomes = runner.run(FORGOTTEN.values(), planted_executor(module_ranks, plant))
    return {case: outcome.result for case, outcome in zip(FORGOTTEN, outcomes, strict=True)}


@pytest.mark.parametrize("case", list(FORGOTTEN))
def test_a_reference_that_does_not_autocast_fails_at_step_0(forgotten, case):
    result = forgotten[case]
    assert result.status == "fail" and result.first_diverging_step == 0, result.reason


def test_the_forgotten_autocast_is_named_with_the_first_linears_dtypes(forgotten):
    (cause,) = [c for c in forgotten["autocast_fp16_mlp"].causes if c.name == "autocast_differs"]
    assert (
        "forward output at step 0 is float16 in the candidate and float32 in the reference" in cause.evidence
    )


def test_under_fsdps_policy_a_forgotten_autocast_shows_in_the_losses_dtype(forgotten):
    """With float16 parameters on both sides, autocast changes no module on the CPU (LayerNorm
    and softmax stay float16 there); it changes the loss, which cross_entropy computes in float32."""
    result = forgotten["mixed_fp16_raw_logits"]
    (cause,) = [c for c in result.causes if c.name == "loss_dtype_differs"]
    assert "every loss of the reference is a float16 value and the candidate's are not" in cause.evidence
