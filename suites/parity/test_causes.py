"""Known causes: each pattern is planted in hand-made records and its hint must appear; records
without the pattern must not get it. The premises each cause stands on (what must have been
measured) have their own tests in ``test_cause_premises.py``."""

import torch

from fixtures.parity_records import next_float, replace_step, run, step
from harness.parity.judge import causes
from harness.parity.judge.compare import compare_runs
from harness.parity.judge.measured import Measured
from harness.parity.plan import profiles

HELD = Measured(source="staged", reordered=12)
"""The staged check held at every stage, some reduced elements summed in another order: the only
evidence under which a rounding cause is named."""


def _causes(
    reference_steps,
    candidate_steps,
    *,
    profile=profiles.EXACT,
    poisoned=frozenset(),
    reduce_dtype=None,
    measured=None,
):
    reference, candidate = run(*reference_steps), run(*candidate_steps)
    comparison = compare_runs(reference, candidate, profile=profile, poisoned_steps=poisoned)
    return causes.match(
        reference,
        candidate,
        comparison,
        poisoned_steps=poisoned,
        reduce_dtype=reduce_dtype,
        measured=measured,
    )


def _names(found):
    return [cause.name for cause in found]


def test_ranks_that_disagree_on_the_skip_decision_point_at_missing_agreement():
    desync = replace_step(step(1, weight=2.0), found_inf=((0.0,), (1.0,)), skipped=((False,), (True,)))
    (cause,) = _causes([step(0), step(1)], [step(0), desync])
    assert cause.name == "skip_desync" and "fairscale#179" in cause.describe()
    assert cause.evidence == "at step 1 the ranks disagree: rank 0 stepped, rank 1 skipped"


def test_gradients_scaled_by_the_world_size_point_at_a_divide_factor_mismatch():
    doubled = replace_step(
        step(0), grads={"layer.weight": torch.full((2, 2), 0.5), "layer.bias": torch.zeros(2)}
    )
    (cause,) = _causes([step(0)], [doubled])
    assert cause.name == "divide_factor" and "torchtitan#2318" in cause.describe()
    assert "every gradient is 2x the reference's (the world size, 2" in cause.evidence


def test_gradients_divided_by_the_world_size_once_more_are_named_too():
    halved = replace_step(
        step(0),
        grads={"layer.weight": torch.tensor([[0.125, -0.25], [0.5, 1.0]]), "layer.bias": torch.zeros(2)},
    )
    reference = replace_step(
        step(0),
        grads={"layer.weight": torch.tensor([[0.25, -0.5], [1.0, 2.0]]), "layer.bias": torch.zeros(2)},
    )
    (cause,) = _causes([reference], [halved])
    assert "0.5x the reference's (1 / the world size" in cause.evidence


def test_gradients_that_differ_unevenly_are_no_divide_factor():
    uneven = replace_step(
        step(0),
        grads={"layer.weight": torch.tensor([[0.25, 0.5], [0.25, 0.25]]), "layer.bias": torch.zeros(2)},
    )
    assert "divide_factor" not in _names(_causes([step(0)], [uneven]))


def test_a_loss_that_differs_at_step_0_points_at_the_forward():
    candidate = replace_step(step(0, weight=2.0), losses=(0.5, 0.75))
    assert _names(_causes([step(0)], [candidate])) == ["forward_differs"]


def test_a_loss_that_differs_later_from_a_common_state_points_at_the_forward():
    """Step 0 bitwise, so step 1 began from the same parameters and state on both sides."""
    later = replace_step(step(1), losses=(0.5, 0.75))
    (cause,) = _causes([step(0), step(1)], [step(0), later])
    assert cause.name == "forward_differs"
    assert cause.evidence == (
        "the loss differs at step 1 on rank(s) 1, from the same parameters and state (the straight runs "
        "were bitwise at every earlier step)"
    )


def test_a_loss_that_differs_only_after_the_runs_drifted_is_not_blamed_on_the_forward():
    """Step 0 a float32 ulp apart (inside ``fp32``), step 1's loss beyond it: drift could do that."""
    drifted = step(0, weight=next_float(1.0))
    later = replace_step(step(1), losses=(0.5, 0.75))
    assert "forward_differs" not in _names(
        _causes([step(0), step(1)], [drifted, later], profile=profiles.FP32)
    )


def test_parameters_differing_while_gradients_match_point_at_the_optimizer():
    (cause,) = _causes([step(0)], [step(0, weight=next_float(1.0), state=next_float(0.125))])
    assert cause.name == "optimizer_only"
    assert cause.evidence == "at step 0 the losses and gradients match, only optimizer state and param differ"


def test_parameters_differing_at_a_poisoned_step_are_not_blamed_on_the_optimizer():
    """Gradients of a step with a planted fault are not compared, so they cannot be said to match."""
    found = _causes(
        [step(0, grad=float("inf"))], [step(0, grad=float("inf"), weight=2.0)], poisoned=frozenset({0})
    )
    assert "optimizer_only" not in _names(found)


def test_buffers_alone_differing_point_at_broadcast_buffers():
    drifted = replace_step(
        step(0), buffers=({"norm.running_mean": torch.zeros(2)}, {"norm.running_mean": torch.ones(2)})
    )
    (cause,) = _causes([step(0)], [drifted])
    assert cause.name == "buffers_only" and "broadcast_buffers" in cause.describe()


def _with_freq(record, dtype, value=0.3):
    buffers = tuple({**own, "rotary.freq": torch.full((2,), value, dtype=dtype)} for own in record.buffers)
    return replace_step(record, buffers=buffers)


def test_a_buffer_held_in_another_dtype_is_named_with_both_dtypes():
    kept = _with_freq(step(0), torch.float32)
    cast = _with_freq(step(0, loss=0.75), torch.bfloat16)
    found = {cause.name: cause for cause in _causes([kept], [cast])}
    assert (
        "rotary.freq is bfloat16 in the candidate and float32 in the reference"
        in found["dtype_differs"].evidence
    )


def test_a_parameter_held_in_another_dtype_is_named_too():
    wide = replace_step(
        step(0, loss=0.75), params={**step(0).params, "layer.bias": torch.zeros(2, dtype=torch.float64)}
    )
    found = {cause.name: cause for cause in _causes([step(0)], [wide])}
    assert (
        "layer.bias is float64 in the candidate and float32 in the reference"
        in found["dtype_differs"].evidence
    )


def test_localization_narrows_the_dtype_cause_to_the_first_diverging_module():
    reference, candidate = (
        run(_with_freq(step(0), torch.float32)),
        run(_with_freq(step(0, loss=0.75), torch.bfloat16)),
    )
    comparison = compare_runs(reference, candidate, profile=profiles.EXACT)
    found = causes.match(reference, candidate, comparison)
    (narrowed,) = [
        c for c in causes.localized(found, reference, candidate, 0, "rotary[0]") if c.name == "dtype_differs"
    ]
    assert narrowed.evidence.startswith(
        "at step 0, in the first diverging module rotary[0], rotary.freq is bfloat16"
    )
    elsewhere = causes.localized(found, reference, candidate, 0, "blocks.0")
    assert elsewhere == found


def _grads(step_record, bias):
    return replace_step(step_record, grads={"layer.weight": torch.full((2, 2), 0.5), "layer.bias": bias})


def test_bf16_gradients_a_few_ulps_apart_on_four_ranks_point_at_the_summation_order():
    """A gradient that nearly cancels (0.004 next to 0.5 in the same tensor) off by 1.5 bfloat16
    ulps of 0.5 fails ``bf16``'s tolerance, and is what another summation order gives."""
    reference = _grads(step(0, world=4), torch.tensor([0.5, 0.00390625]))
    candidate = _grads(step(0, world=4), torch.tensor([0.5, 0.00390625 + 1.5 * 2**-8]))
    found = _causes(
        [reference], [candidate], profile=profiles.BF16, reduce_dtype=torch.bfloat16, measured=HELD
    )
    assert _names(found) == ["reduce_order"]
    assert "within 6 bfloat16 ulps" in found[0].evidence and "layer.bias: 1.5" in found[0].evidence


def test_momentum_drifting_on_gradients_a_few_ulps_apart_on_four_ranks_is_summation_order_too():
    """The gradients pass ``fp16``'s tolerance but differ by an fp16 ulp; the momentum buffer that
    sums them fails it: the same reduction order, accumulated."""
    reference = _grads(step(0, world=4), torch.tensor([0.5, 0.00390625]))
    candidate = replace_step(
        _grads(step(0, world=4), torch.tensor([0.5, 0.00390625 + 2**-11])),
        optim_state={"layer.weight": {"momentum_buffer": torch.full((2, 2), 0.13)}},
    )
    found = _causes(
        [reference], [candidate], profile=profiles.FP16, reduce_dtype=torch.float16, measured=HELD
    )
    assert _names(found) == ["reduce_order"]  # every stage held: the update too


def test_a_difference_that_began_as_summation_order_and_grew_is_named_from_where_it_began():
    """Step 0's gradients one bfloat16 ulp apart (inside the profile), step 1's far apart: a model
    that amplifies small differences grew what the reduction order began."""
    base, near = torch.tensor([0.5, 0.25]), torch.tensor([0.5, 0.25 + 2**-9])
    reference = [_grads(step(0, world=4), base), _grads(step(1, world=4), base)]
    candidate = [_grads(step(0, world=4), near), _grads(step(1, world=4), torch.tensor([0.5, 0.375]))]
    found = _causes(reference, candidate, profile=profiles.BF16, reduce_dtype=torch.bfloat16, measured=HELD)
    assert _names(found) == ["reduce_order"]
    assert found[0].evidence.startswith("the gradients first differ at step 0")
    assert "by step 1 the difference has grown past the profile" in found[0].evidence


def test_a_difference_that_begins_far_beyond_a_few_ulps_is_no_summation_order():
    base = torch.tensor([0.5, 0.25])
    reference = [_grads(step(0, world=4), base), _grads(step(1, world=4), base)]
    candidate = [_grads(step(0, world=4), base), _grads(step(1, world=4), torch.tensor([0.5, 0.375]))]
    found = _causes(reference, candidate, profile=profiles.BF16, reduce_dtype=torch.bfloat16, measured=HELD)
    assert "reduce_order" not in _names(found)


def test_no_summation_order_blamed_at_two_ranks_in_float32_or_far_beyond_a_few_ulps():
    """Two addends commute, float32 rows are not reduced in low precision, and a gradient 40 ulps
    away is another gradient."""
    near, far = torch.tensor([0.5, 0.00390625 + 1.5 * 2**-8]), torch.tensor([0.5, 0.00390625 + 40 * 2**-8])
    base = torch.tensor([0.5, 0.00390625])
    for world, dtype, bias in ((2, torch.bfloat16, near), (4, None, near), (4, torch.bfloat16, far)):
        reference, candidate = _grads(step(0, world=world), base), _grads(step(0, world=world), bias)
        found = _causes([reference], [candidate], profile=profiles.BF16, reduce_dtype=dtype, measured=HELD)
        assert "reduce_order" not in _names(found), (world, dtype)


def test_parameters_moved_by_adam_on_a_noise_gradient_are_named_with_it():
    """A bias whose gradient is rounding noise (1e-9 next to 0.5) moves apart while the gradients
    pass the profile: Adam's normalization, not the sharding."""
    noisy = {"layer.weight": torch.full((2, 2), 0.5), "layer.bias": torch.full((2,), 1e-9)}
    reference = replace_step(step(0), grads=noisy)
    candidate = replace_step(
        step(0),
        grads={"layer.weight": torch.full((2, 2), 0.5), "layer.bias": torch.full((2,), 3e-9)},
        params={"layer.weight": torch.full((2, 2), 1.0), "layer.bias": torch.full((2,), 3e-5)},
    )
    found = _causes([reference], [candidate], profile=profiles.FP32, measured=HELD)
    assert _names(found) == ["noise_gradient"]  # every stage held: the update too
    assert "layer.bias (|grad| <= 1e-09)" in found[0].evidence


def test_parameters_moved_with_a_real_gradient_are_no_noise_gradient():
    moved = replace_step(
        step(0), params={"layer.weight": torch.full((2, 2), 1.5), "layer.bias": torch.zeros(2)}
    )
    assert "noise_gradient" not in _names(_causes([step(0)], [moved], profile=profiles.FP32, measured=HELD))


def test_a_run_that_matches_has_no_cause():
    assert _causes([step(0)], [step(0)]) == ()


def test_each_cause_in_the_catalogue_has_a_name_of_its_own():
    names = [known.name for known in causes.CATALOGUE]
    assert len(names) == len(set(names)) == 34


def test_the_catalogue_lists_every_cause_of_every_family_once():
    assert sorted(known.name for known in causes.CATALOGUE) == sorted(known.name for known in causes.FAMILIES)


def _rounded_grads(record, dtype=torch.bfloat16):
    return replace_step(record, grads={n: g.to(dtype).float() for n, g in record.grads.items()})


def _fine_grads(record):
    """Gradients with more bits than bfloat16 holds (a float32 reduction's)."""
    fine = torch.tensor([[0.3, -0.7], [1.1, 2.3]])
    return replace_step(record, grads={"layer.weight": fine, "layer.bias": torch.zeros(2)})


def test_gradients_that_are_all_bfloat16_values_where_the_reference_reduces_in_float32_are_named():
    reference = _fine_grads(step(0))
    (cause,) = _causes([reference], [_rounded_grads(reference)])
    assert cause.name == "reduced_in_lower_dtype"
    assert (
        "every element of the 1 gradients that differ is a bfloat16 value in the candidate" in cause.evidence
    )


def test_a_reduction_already_in_bfloat16_is_never_named_lower():
    reference = _fine_grads(step(0))
    found = _causes([reference], [_rounded_grads(reference)], reduce_dtype=torch.bfloat16)
    assert "reduced_in_lower_dtype" not in _names(found)


def test_gradients_rounded_after_a_forward_that_differs_are_not_blamed_on_the_reduction():
    reference = _fine_grads(step(0))
    candidate = replace_step(_rounded_grads(reference), losses=(0.75, 0.75))
    assert "reduced_in_lower_dtype" not in _names(_causes([reference], [candidate]))
