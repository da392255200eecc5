"""The reference is the candidate's unsharded twin, field by field (and FSDP2's autograd nodes).

For every field of ``PrecisionPolicy`` (parameter dtype, reduce dtype, buffers cast or kept, where
inputs are cast, output dtype, low-precision grads) one configuration where the field changes the
numbers (``fixtures/policy_workload.py`` is built for that) passes bitwise against the faithful
reference, and fails once the reference is made to ignore that field alone
(``fixtures/parity_plants.py``, ``reference_ignores``).
"""

import pytest

from fixtures.parity_plants import Plant, planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import ParityConfig
from harness.parity.plan.precision import PrecisionPolicy
from suites.parity.support import ranks_executor

_WORKLOAD = {
    "workload": "fixtures.policy_workload:policy_net",
    "optimizer": "sgd",
    "steps": 3,
    "precision": "bf16",
}
FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True, **_WORKLOAD}
FSDP1 = {"engine": "fsdp1", "sharding": "full_shard", "use_orig_params": True, **_WORKLOAD}

CASES = {
    # case: (configuration, the field the reference gets wrong, the value it uses instead)
    "param": (ParityConfig.from_flat(**FSDP2), "param", "fp16"),
    "reduce": (
        ParityConfig.from_flat(**FSDP2, mixed=PrecisionPolicy(param="bf16", reduce="fp32", inputs="units")),
        "reduce",
        None,
    ),
    "buffers_kept": (ParityConfig.from_flat(**FSDP2), "buffers", "bf16"),
    "buffers_cast": (ParityConfig.from_flat(**FSDP1), "buffers", None),
    "inputs_every_unit": (ParityConfig.from_flat(**FSDP2), "inputs", "root"),
    "inputs_root_only": (ParityConfig.from_flat(**FSDP1), "inputs", "units"),
    "output": (
        ParityConfig.from_flat(
            **FSDP2,
            mixed=PrecisionPolicy(param="bf16", reduce="bf16", inputs="units", output="fp32"),
        ),
        "output",
        None,
    ),
    "keep_low_precision_grads": (
        ParityConfig.from_flat(
            **FSDP1,
            mixed=PrecisionPolicy(param="bf16", reduce="bf16", buffers="bf16", keep_low_precision_grads=True),
        ),
        "keep_low_precision_grads",
        False,
    ),
}


@pytest.fixture(scope="module")
def faithful(module_ranks):
    """``{case: ParityResult}`` against the reference as shipped."""
    configs = [config for config, _, _ in CASES.values()]
    outcomes = runner.run(configs, ranks_executor(module_ranks), localize=False)
    return {case: outcome.result for case, outcome in zip(CASES, outcomes, strict=True)}


@pytest.fixture(scope="module")
def ignoring(module_ranks):
    """``{case: ParityResult}`` against a reference that ignores the case's field."""
    found = {}
    for case, (config, field, value) in CASES.items():
        plant = Plant(kind="reference_ignores", field=field, value=value)
        (outcome,) = runner.run([config], planted_executor(module_ranks, plant), localize=False)
        found[case] = outcome.result
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_the_reference_emulates_the_candidates_policy_bitwise(faithful, case):
    result = faithful[case]
    assert result.status == "pass", f"{result.config.id}: {result.status} {result.reason}"
    assert result.closeness == "bitwise"


def _broken(result):
    return result.status in ("fail", "crash", "error")


def test_a_reference_in_another_parameter_dtype_fails(ignoring):
    assert _broken(ignoring["param"])


def test_a_reference_that_reduces_in_the_parameter_dtype_where_the_candidate_reduces_in_fp32_is_seen(
    ignoring,
):
    """The straight comparison is no longer bitwise; the staged check then judges the candidate's
    reduction by the order-free bound of the dtype its *policy* names (not the reference's) and
    adopts the candidate's reduced gradients, so this correct candidate passes there: a reference
    that reduces wrongly can cost a row its bitwise verdict, never give a wrong one."""
    result = ignoring["reduce"]
    assert result.max_ulp > 0 and result.closeness != "bitwise", result.closeness
    assert result.staged is not None and result.staged.passed, result.staged


def test_a_reference_that_casts_buffers_fsdp2_keeps_in_fp32_fails(ignoring):
    assert _broken(ignoring["buffers_kept"])


def test_a_reference_that_keeps_buffers_fsdp1_casts_to_buffer_dtype_fails(ignoring):
    assert _broken(ignoring["buffers_cast"])


def test_a_reference_that_casts_inputs_at_the_root_only_where_fsdp2_casts_at_every_unit_fails(ignoring):
    assert _broken(ignoring["inputs_every_unit"])


def test_a_reference_that_casts_inputs_at_every_unit_where_fsdp1_casts_at_the_root_fails(ignoring):
    assert _broken(ignoring["inputs_root_only"])


def test_a_reference_that_ignores_the_output_dtype_fails(ignoring):
    assert _broken(ignoring["output"])


def test_a_reference_that_upcasts_grads_fsdp1_keeps_in_low_precision_fails(ignoring):
    assert _broken(ignoring["keep_low_precision_grads"])


_SHARED = ParityConfig.from_flat(
    **{**FSDP2, "precision": "fp32", "workload": "fixtures.policy_workload:shared_net"}
)


@pytest.fixture(scope="module")
def shared(module_ranks):
    """A value fed to a unit and the root, FSDP2 in float32: with and without FSDP2's nodes."""
    (faithful,) = runner.run([_SHARED], ranks_executor(module_ranks), localize=False)
    plant = Plant(kind="reference_without_fsdp2_nodes")
    (planted,) = runner.run([_SHARED], planted_executor(module_ranks, plant), localize=False)
    return faithful.result, planted.result


def test_the_fsdp2_reference_sums_a_shared_inputs_gradient_as_fsdp2_does_bitwise(shared):
    faithful, _ = shared
    assert faithful.status == "pass" and faithful.closeness == "bitwise", faithful.reason


def test_a_reference_without_fsdp2s_autograd_node_on_unit_inputs_fails(shared):
    _, planted = shared
    assert _broken(planted)


def test_fsdp2_refuses_a_policy_field_it_cannot_express():
    with pytest.raises(ValueError, match="FSDP2 never casts buffers"):
        ParityConfig.from_flat(**FSDP2, mixed=PrecisionPolicy(param="bf16", buffers="bf16", inputs="units"))


def test_a_policy_other_than_the_engines_default_is_named_in_the_id():
    config, _, _ = CASES["reduce"]
    assert config.id == "fsdp2-reshard-bf16-reduce_fp32-sgd-policy_net-w2"
