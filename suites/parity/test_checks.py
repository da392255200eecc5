"""Every check the report claims to make has teeth: one behaviour each, on hand-made records that
differ from the reference in exactly that one thing, which must be named, and nothing else.

These are the tests the mutation check runs against plants in ``harness/parity/`` (a check
removed or loosened): each must fail when its check lies.
"""

import dataclasses

import torch

from fixtures.parity_records import next_float, replace_step, run, step
from harness.parity.judge.compare import compare_runs
from harness.parity.plan import profiles

EXACT, FP32 = profiles.EXACT, profiles.FP32


def _whats(candidate_step, profile=EXACT, reference_step=None):
    reference = run(reference_step or step(0))
    return [d.what for d in compare_runs(reference, run(candidate_step), profile=profile).divergences]


def test_ranks_that_disagree_on_found_inf_alone_are_named():
    assert _whats(replace_step(step(0), found_inf=((0.0,), (1.0,)))) == ["agreement", "found_inf"]


def test_ranks_that_disagree_on_the_growth_tracker_alone_are_named():
    assert _whats(replace_step(step(0), trackers=(1, 0)))[:1] == ["agreement"]


def test_a_skip_decision_unlike_the_references_is_named_even_when_the_ranks_agree():
    assert "skipped" in _whats(step(0, skipped=True))


def test_a_scale_unlike_the_references_is_named():
    assert _whats(step(0, scale=8.0)) == ["scale"]


def test_a_growth_tracker_unlike_the_references_is_named():
    assert _whats(step(0, tracker=2)) == ["tracker"]


def test_the_loss_of_the_last_rank_is_compared_too():
    assert _whats(replace_step(step(0), losses=(0.5, next_float(0.5))), reference_step=step(0)) == ["loss"]


def test_a_gradient_alone_differing_is_named():
    assert _whats(step(0, grad=next_float(0.25))) == ["grad"]


def test_a_parameter_alone_differing_is_named():
    assert _whats(step(0, weight=next_float(1.0))) == ["param"]


def test_optimizer_state_alone_differing_is_named():
    assert _whats(step(0, state=next_float(0.125))) == ["optim_state"]


def test_a_buffer_differing_on_one_rank_only_is_named_as_a_buffer():
    candidate = replace_step(
        step(0), buffers=({"norm.running_mean": torch.zeros(2)}, {"norm.running_mean": torch.ones(2)})
    )
    comparison = compare_runs(run(step(0)), run(candidate), profile=EXACT)
    assert [d.what for d in comparison.divergences] == ["buffer"]
    assert "norm.running_mean [rank 1]" in comparison.first.message


def test_buffers_are_compared_by_value_whatever_their_dtype():
    """FSDP1's mixed precision casts buffers to the low dtype, FSDP2's does not."""
    low = replace_step(step(0), buffers=({"norm.running_mean": torch.zeros(2, dtype=torch.bfloat16)},) * 2)
    assert compare_runs(run(step(0)), run(low), profile=EXACT).ok


def test_the_exact_profile_fails_one_ulp_that_the_fp32_profile_allows():
    one_ulp = step(0, weight=next_float(1.0))
    assert _whats(one_ulp, profile=EXACT) == ["param"]
    assert _whats(one_ulp, profile=FP32) == []


def test_a_difference_past_the_profile_tolerance_fails_it():
    assert _whats(step(0, weight=1.0 + 1e-4), profile=FP32) == ["param"]


def test_every_step_is_checked_not_only_the_first_and_last():
    reference = run(step(0), step(1), step(2))
    candidate = run(step(0), step(1, grad=next_float(0.25)), step(2))
    assert compare_runs(reference, candidate, profile=EXACT).first.step == 1


def test_a_candidate_with_fewer_steps_fails_even_when_every_step_it_has_matches():
    comparison = compare_runs(run(step(0), step(1)), run(step(0)), profile=EXACT)
    assert [d.what for d in comparison.divergences] == ["steps"]


def test_a_nan_against_a_number_fails_every_profile():
    nan_grad = dataclasses.replace(
        step(0), grads={**step(0).grads, "layer.bias": torch.tensor([float("nan"), 0.0])}
    )
    for profile in profiles.PROFILES.values():
        assert _whats(nan_grad, profile=profile) == ["grad"], profile.name
