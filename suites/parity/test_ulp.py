"""Distances in units in the last place, and the label each passing configuration gets from them."""

import math

import pytest
import torch

from fixtures.parity_records import next_float, run, step
from harness.parity.judge.compare import compare_runs
from harness.parity.plan import profiles
from harness.parity.ranks import staged
from harness.parity.ranks.measure import ulp
from harness.parity.ranks.measure.distance import tensor_diff


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_neighbouring_floats_are_one_ulp_apart_in_their_own_dtype(dtype):
    values = torch.tensor([1.0, -3.5, 1e-3], dtype=dtype)
    moved = (
        torch.nextafter(values.double(), torch.tensor(math.inf, dtype=torch.float64))
        if dtype == torch.float64
        else None
    )
    if moved is None:
        bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[dtype]
        moved = (values.view(bits) + 1).view(dtype)
    assert ulp.distances(values, moved).tolist() == [1.0, 1.0, 1.0]


def test_zero_and_negative_zero_are_the_same_and_the_smallest_values_straddle_zero():
    tiny = torch.finfo(torch.float32).smallest_normal * 2**-23  # the smallest subnormal
    assert ulp.max_distance(torch.tensor([0.0]), torch.tensor([-0.0])) == 0
    assert ulp.max_distance(torch.tensor([-tiny]), torch.tensor([tiny])) == 2


def test_nan_matches_nan_and_is_infinitely_far_from_a_number():
    assert ulp.max_distance(torch.tensor([math.nan]), torch.tensor([math.nan])) == 0
    assert ulp.max_distance(torch.tensor([1.0]), torch.tensor([math.nan])) == math.inf


def test_different_dtypes_are_measured_in_the_coarser_one():
    assert ulp.coarser(torch.float32, torch.bfloat16) == torch.bfloat16
    assert (
        ulp.max_distance(torch.tensor([1.0]), torch.tensor([1.0 + 2**-20], dtype=torch.float32).bfloat16())
        == 0
    )


def test_a_tensor_diff_reports_its_ulp_distance_next_to_abs_and_rel():
    diff = tensor_diff(
        torch.tensor([1.0, 2.0]),
        torch.tensor([next_float(1.0, 3), 2.0]),
        profiles.EXACT,
        step=0,
        kind="grad",
        name="g",
    )
    assert diff.max_ulp == 3 and diff.describe().endswith("max rel 3.58e-07, 3 ulp")


def test_losses_are_measured_in_ulps_of_float32():
    candidate = run(step(0, loss=next_float(0.5, 2)))
    comparison = compare_runs(run(step(0)), candidate, profile=profiles.FP32)
    assert comparison.ok and comparison.max_ulp == 2


@pytest.mark.parametrize(
    ("max_ulp", "passed", "expected"),
    [
        (0, True, "bitwise"),
        (1, True, "≤ 1 ulp"),
        (3, True, "≤ 4 ulp"),
        (64, True, "≤ 64 ulp"),
        (65, True, "toleranced"),
        (math.inf, True, "toleranced"),
        (0, False, ""),
    ],
)
def test_each_passing_configuration_is_labelled_by_what_was_measured(max_ulp, passed, expected):
    assert ulp.label(max_ulp, passed=passed) == expected


def test_a_comparison_is_bitwise_only_when_every_value_is_equal():
    assert compare_runs(run(step(0)), run(step(0)), profile=profiles.EXACT).closeness == "bitwise"
    close = compare_runs(run(step(0)), run(step(0, state=next_float(0.125))), profile=profiles.FP32)
    assert close.closeness == "≤ 1 ulp"
    far = compare_runs(run(step(0)), run(step(0, weight=next_float(1.0, 80))), profile=profiles.FP32)
    assert far.ok and far.closeness == "toleranced"


def test_per_step_distances_mark_the_failing_steps():
    reference = run(step(0), step(1))
    comparison = compare_runs(
        reference, run(step(0), step(1, weight=next_float(1.0))), profile=profiles.EXACT
    )
    assert [(d.step, d.max_ulp, d.failed) for d in comparison.steps] == [(0, 0.0, False), (1, 1.0, True)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_same_bits_holds_for_a_copy_nans_included(dtype):
    values = torch.tensor([1.0, -2.5, math.nan, math.inf, 0.0], dtype=dtype)
    assert ulp.same_bits(values, values.clone())


def test_same_bits_fails_on_a_last_bit_of_the_last_element():
    values = torch.linspace(-1, 1, 9)
    moved = values.clone()
    moved[-1] = next_float(float(moved[-1]))
    assert not ulp.same_bits(values, moved)


def test_same_bits_tells_the_zeros_apart_and_the_dtypes_apart():
    assert not ulp.same_bits(torch.tensor([0.0]), torch.tensor([-0.0]))
    assert not ulp.same_bits(torch.ones(3), torch.ones(3, dtype=torch.float64))


def test_the_staged_check_measures_no_distance_between_tensors_of_the_same_bits(monkeypatch):
    def measured(*_):
        raise AssertionError("measured tensors of the same bits")

    monkeypatch.setattr(ulp, "distances", measured)
    found = staged._compared({"w": torch.arange(6.0)}, {"w": torch.arange(6.0)})
    assert (found["w"].elements, found["w"].differing, found["w"].max_ulp) == (6, 0, 0.0)


def test_the_staged_check_still_counts_a_last_bit_apart_and_signed_zeros_alike():
    want = torch.tensor([0.0, 1.0, 2.0])
    got = torch.tensor([-0.0, 1.0, next_float(2.0)])
    found = staged._compared({"w": want}, {"w": got})["w"]
    assert (found.differing, found.max_ulp) == (1, 1.0)
