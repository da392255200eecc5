"""Curves against baselines: what is a regression, what is drift, and how a finding reads."""

import math

from ci.gate import baselines, curves
from suites.ci.support import ADAM_BF16, LOSSES, NORMS, SCALES, SGD, report, result


def _baseline(*results):
    document = report(*results)
    return {config["id"]: curves.points_of(config) for config in document["configs"]}


def test_identical_curves_are_compared_and_find_nothing():
    comparison = curves.compare(report(result()), _baseline(result()))
    assert comparison.compared == (SGD.id,) and comparison.findings == ()


def test_a_loss_that_leaves_its_tolerance_names_configuration_metric_first_step_and_values():
    moved = ((2.5, 2.4), (2.25, 2.2), (2.0, 2.0), (1.75, 1.8))
    (finding,) = curves.compare(report(result(losses=moved)), _baseline(result())).findings
    assert (finding.kind, finding.configuration, finding.metric, finding.step) == (
        "regression",
        SGD.id,
        "loss[rank 1]",
        2,
    )
    assert (finding.expected, finding.got, finding.mismatched, finding.total) == (1.9, 2.0, 2, 4)
    assert finding.describe() == (
        "loss[rank 1] first differs at step 2 (2 of 4 steps): expected 1.9 ± 1.2e-05, got 2.0 (abs 0.1, rel 0.0526)"
    )


def test_a_difference_within_the_precisions_tolerance_is_no_finding():
    nudged = tuple((a * (1 + 1e-7), b) for a, b in LOSSES)  # well inside fp32's rtol 1.3e-6
    assert curves.compare(report(result(losses=nudged)), _baseline(result())).findings == ()


def test_bf16_curves_get_bf16s_tolerance():
    nudged = tuple((a * 1.01, b) for a, b in LOSSES)  # 1%: inside bf16's rtol 1.6e-2, outside fp32's
    assert (
        curves.compare(report(result(ADAM_BF16, losses=nudged)), _baseline(result(ADAM_BF16))).findings == ()
    )
    assert curves.compare(report(result(losses=nudged)), _baseline(result())).findings != ()


def test_fp16_curves_allow_the_drift_measured_across_cpu_kernel_families():
    """make kernels measured an fp16 grad norm 2.2e-3 apart under ATen's scalar and AVX-512 kernels."""
    fp16 = SGD.with_(precision="fp16")
    drifted = tuple(n * (1 + 2.2e-3) for n in NORMS)
    assert curves.compare(report(result(fp16, norms=drifted)), _baseline(result(fp16))).findings == ()
    broken = tuple(n * 1.05 for n in NORMS)  # 5%: what a scaler bug does, and more
    assert curves.compare(report(result(fp16, norms=broken)), _baseline(result(fp16))).findings != ()


def test_the_scale_is_compared_exactly():
    (finding,) = curves.compare(report(result(scales=SCALES[:3] + (131072.5,))), _baseline(result())).findings
    assert (finding.metric, finding.step, finding.tolerance) == ("scale", 3, "")


def test_non_finite_values_match_only_the_same_non_finite_value():
    inf_then_nan = (math.inf, math.nan, 1.0, 0.75)
    base = _baseline(result(norms=inf_then_nan))
    assert curves.compare(report(result(norms=inf_then_nan)), base).findings == ()
    (finding,) = curves.compare(report(result(norms=(math.inf, 1.25, 1.0, 0.75))), base).findings
    assert (finding.metric, finding.step, math.isnan(finding.expected), finding.got) == (
        "grad_norm",
        1,
        True,
        1.25,
    )


def test_a_run_with_another_number_of_steps_is_one_finding():
    short = result(losses=LOSSES[:3], scales=SCALES[:3], norms=NORMS[:3])
    (finding,) = curves.compare(report(short), _baseline(result())).findings
    assert (finding.metric, finding.detail) == ("steps", "ran 3 steps, the baseline has 4")


def test_another_torch_versions_baseline_labels_the_differences_drift():
    moved = result(losses=((2.5, 2.4),) * 4)
    comparison = curves.compare(report(moved), _baseline(result()), drift=True)
    assert {f.kind for f in comparison.findings} == {"drift"} and comparison.failing == ()


def test_a_configuration_that_ran_without_a_baseline_is_missing_and_fails():
    (finding,) = curves.compare(report(result(), result(ADAM_BF16)), _baseline(result())).findings
    assert (finding.kind, finding.configuration, finding.fails) == ("missing", ADAM_BF16.id, True)
    assert "--update-baselines" in finding.describe()


def test_a_baselined_configuration_that_did_not_run_fails_a_whole_tier_run_only():
    document = report(result(), result(ADAM_BF16, status="skip"))
    base = _baseline(result(), result(ADAM_BF16))
    (finding,) = curves.compare(document, base, whole_tier=True).findings
    assert (finding.kind, finding.configuration) == ("not_run", ADAM_BF16.id)
    assert "did not run (skip: cannot run here)" in finding.detail
    assert curves.compare(document, base, whole_tier=False).findings == ()


def test_a_baseline_the_tier_no_longer_has_is_a_note_not_a_failure():
    (finding,) = curves.compare(report(result()), _baseline(result(), result(ADAM_BF16))).findings
    assert (finding.kind, finding.fails) == ("unused", False)


def test_updating_from_a_whole_tier_run_drops_what_the_tier_no_longer_has_and_keeps_what_broke():
    old = _baseline(result(), result(ADAM_BF16))
    old["gone-w2"] = old[SGD.id]
    moved = result(losses=((9.0, 9.0),) * 4)
    document = report(moved, result(ADAM_BF16, losses=((8.0, 8.0),) * 4))
    new = curves.updated(old, document, keep=frozenset({SGD.id}), whole_tier=True)
    assert set(new) == {SGD.id, ADAM_BF16.id}
    assert new[SGD.id][0].loss == (9.0, 9.0)  # rewritten
    assert new[ADAM_BF16.id] == old[ADAM_BF16.id]  # broke: its old entry stays


def test_updating_from_a_narrowed_run_rewrites_only_what_ran():
    old = _baseline(result(), result(ADAM_BF16))
    new = curves.updated(
        old, report(result(losses=((9.0, 9.0),) * 4)), keep=frozenset({SGD.id}), whole_tier=False
    )
    assert new[SGD.id][0].loss == (9.0, 9.0) and new[ADAM_BF16.id] == old[ADAM_BF16.id]


def test_points_are_read_from_the_candidates_curves_of_parity_json():
    (config,) = report(result())["configs"]
    points = curves.points_of(config)
    assert points[2] == baselines.StepPoint(step=2, scale=131072.0, grad_norm=1.0, loss=(2.0, 1.9))
    (skipped,) = report(result(status="skip"))["configs"]
    assert curves.points_of(skipped) is None
