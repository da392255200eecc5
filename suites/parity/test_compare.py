"""compare_runs names the first diverging step and the worst tensor, checking what matters first."""

import math

import torch

from fixtures.parity_records import replace_step, run, step
from harness.parity.judge.compare import compare_runs, tensor_diff
from harness.parity.plan import profiles

EXACT, FP32 = profiles.EXACT, profiles.FP32


def test_identical_runs_match_bitwise():
    reference = run(step(0), step(1))
    comparison = compare_runs(reference, run(step(0), step(1)), profile=EXACT)
    assert comparison.ok and comparison.worst is None and comparison.max_loss_diff == 0.0


def test_the_first_diverging_step_and_the_worst_tensor_are_named():
    reference = run(step(0), step(1), step(2))
    candidate = run(step(0), step(1, weight=1.0 + 2**-10), step(2, weight=2.0))
    comparison = compare_runs(reference, candidate, profile=EXACT)
    assert comparison.first.step == 1 and comparison.first.what == "param"
    assert comparison.first.message == (
        "step 1, param layer.weight: 4 / 4 mismatched; max abs 0.000977, max rel 0.000977, 8192 ulp (profile exact)"
    )
    assert (comparison.worst.step, comparison.worst.name) == (1, "layer.weight")


def test_a_difference_within_the_profile_passes_but_is_reported_as_the_worst():
    candidate = run(step(0, weight=1.0 + 2**-22))
    comparison = compare_runs(run(step(0)), candidate, profile=FP32)
    assert comparison.ok
    assert comparison.worst.name == "layer.weight" and comparison.worst.max_abs == 2**-22


def test_ranks_that_disagree_come_before_anything_else():
    disagreeing = replace_step(step(0, weight=5.0), scales=(4.0, 2.0), skipped=((False,), (True,)))
    comparison = compare_runs(run(step(0)), run(disagreeing), profile=EXACT)
    assert [d.what for d in comparison.divergences[:2]] == ["agreement", "agreement"]
    assert (
        comparison.first.message
        == "step 0, scale differs across ranks: rank 0=4.0, rank 1=2.0 (profile exact)"
    )
    assert (
        "optimizer 0 skipped on some ranks only: rank 0=False, rank 1=True"
        in comparison.divergences[1].message
    )


def test_a_rank_with_an_empty_shard_does_not_count_as_disagreeing():
    empty_on_rank_1 = replace_step(step(0), skipped=((False,), (None,)))
    assert compare_runs(run(step(0)), run(empty_on_rank_1), profile=EXACT).ok


def test_skip_decision_scale_and_tracker_must_equal_the_references_exactly():
    candidate = run(step(0, skipped=True, scale=2.0, tracker=0))
    whats = [d.what for d in compare_runs(run(step(0)), candidate, profile=FP32).divergences]
    assert whats[:4] == ["skipped", "found_inf", "scale", "tracker"]


def test_losses_are_compared_on_every_rank():
    candidate = replace_step(step(0), losses=(0.5, 0.75))
    (divergence,) = compare_runs(run(step(0)), run(candidate), profile=FP32).divergences
    assert divergence.message == "step 0, rank 1 loss 0.75, reference 0.5 (abs diff 0.25) (profile fp32)"


def test_names_shapes_and_dtypes_are_checked_before_values():
    wrong = replace_step(
        step(0),
        params={"layer.weight": torch.ones(4), "layer.bias": torch.zeros(2, dtype=torch.float16)},
        grads={"layer.weight": torch.full((2, 2), 0.25)},
    )
    messages = [d.message for d in compare_runs(run(step(0)), run(wrong), profile=EXACT).divergences]
    assert "step 0, grad names differ: missing ['layer.bias'], unexpected [] (profile exact)" in messages
    assert (
        "step 0, param layer.bias: dtype torch.float16, reference torch.float32 (profile exact)" in messages
    )
    assert "step 0, param layer.weight: shape (4,), reference (2, 2) (profile exact)" in messages


def test_gradients_of_a_poisoned_step_are_not_compared_but_parameters_are():
    poisoned = step(1, grad=math.inf, skipped=True)
    reference = run(step(0), replace_step(poisoned, grads={"layer.weight": torch.full((2, 2), math.nan)}))
    assert compare_runs(reference, run(step(0), poisoned), profile=EXACT, poisoned_steps=frozenset({1})).ok
    moved = replace_step(poisoned, params={**poisoned.params, "layer.weight": torch.full((2, 2), 3.0)})
    first = compare_runs(reference, run(step(0), moved), profile=EXACT, poisoned_steps=frozenset({1})).first
    assert (first.step, first.what) == (1, "param")


def test_a_candidate_that_raised_is_a_crash_after_its_last_step():
    candidate = run(step(0), role="candidate", error="[rank 0] Traceback\n[rank 0] RuntimeError: boom")
    comparison = compare_runs(run(step(0), step(1)), candidate, profile=EXACT)
    assert comparison.first.what == "crash"
    assert comparison.first.message == "step 1, the candidate raised: [rank 0] RuntimeError: boom"


def test_a_crash_whose_message_spans_lines_is_named_by_its_type_and_first_line():
    traceback_text = "\n".join(
        f"[rank 1] {line}"
        for line in (
            "Traceback (most recent call last):",
            '  File "model.py", line 3, in forward',
            "    return x == y",
            "NotImplementedError: Could not run 'aten::eq.Tensor' with arguments from the 'SparseCPU' backend.",
            "",
            "PythonDispatcher: registered at PythonFallbackKernel.cpp:196 [backend fallback]",
        )
    )
    candidate = run(step(0), role="candidate", error=traceback_text)
    message = compare_runs(run(step(0), step(1)), candidate, profile=EXACT).first.message
    assert message == (
        "step 1, the candidate raised: [rank 1] NotImplementedError: Could not run 'aten::eq.Tensor' "
        "with arguments from the 'SparseCPU' backend."
    )


def test_nan_matches_nan_and_an_infinity_the_same_infinity():
    values = torch.tensor([math.nan, math.inf, -math.inf, 1.0])
    assert tensor_diff(values, values.clone(), EXACT, step=0, kind="grad", name="g").mismatched == 0
    flipped = torch.tensor([math.nan, -math.inf, -math.inf, 1.0])
    diff = tensor_diff(values, flipped, FP32, step=0, kind="grad", name="g")
    assert diff.mismatched == 1 and diff.max_abs == math.inf


def test_sparse_tensors_are_compared_as_their_dense_sums():
    sparse = torch.sparse_coo_tensor([[1, 1]], [0.5, 0.25], (3,), check_invariants=True)
    assert (
        tensor_diff(torch.tensor([0.0, 0.75, 0.0]), sparse, EXACT, step=0, kind="grad", name="g").mismatched
        == 0
    )


def test_the_gap_between_two_runs_is_their_largest_loss_and_parameter_difference():
    from harness.parity.ranks.measure.gap import gap

    other = run(step(0), step(1))
    mine = run(step(0, loss=0.625), step(1, weight=1.5))
    found = gap(mine, other)
    assert (found.loss_max_abs, found.loss_max_rel) == (0.125, 0.25)
    assert (found.param_max_abs, found.param_max_rel) == (0.5, 0.5)
    assert found.describe() == "loss rel 0.25, params rel 0.5"


def test_the_gap_measured_on_each_rank_step_by_step_and_merged_is_the_gap_of_the_merged_records():
    from harness.parity.ranks.measure.gap import gap, merge, of_steps
    from harness.parity.ranks.wire import Gap

    def on_rank(rank: int) -> Gap:
        """As ``stepcheck.Check`` measures it: one step at a time, the running maximum kept."""
        found = None
        for want, got in zip(mine, other, strict=True):
            params = (want.params, got.params) if rank == 0 else (None, None)
            part = of_steps([(want.losses[rank], got.losses[rank], *params)])
            found = part if found is None else merge([found, part])
        assert found is not None
        return found

    other = [step(0), step(1)]
    mine = [replace_step(step(0), losses=(0.5, 0.75)), step(1, weight=1.5)]
    merged = merge([on_rank(r) for r in range(2)])
    assert merged == gap(run(*mine), run(*other))
    assert (merged.loss_max_abs, merged.param_max_rel) == (0.25, 0.5)
