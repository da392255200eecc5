"""Known causes of a recipe whose twin does not autocast as its candidate does, planted in hand-made
records and localizations (no ranks): each names the pattern; records without it do not get it."""

from fixtures.parity_records import replace_step, run, step
from harness.parity.judge import causes
from harness.parity.judge.causes import forward
from harness.parity.judge.compare import compare_runs
from harness.parity.judge.evidence import Evidence
from harness.parity.judge.pinpoint import Localization, ModuleDiff
from harness.parity.plan import profiles

_FLOAT16_LOSS = 1.65625  # a float16 value
_FLOAT32_LOSS = 1.655940055847168  # float32's nearest to what autocast's cross_entropy gave


def _losses(reference, candidate):
    ref = run(replace_step(step(0), losses=tuple(reference)))
    cand = run(replace_step(step(0), losses=tuple(candidate)))
    comparison = compare_runs(ref, cand, profile=profiles.EXACT)
    return causes.match(ref, cand, comparison)


def _names(found):
    return [cause.name for cause in found]


def test_a_loss_in_float16_against_one_in_float32_is_named_with_the_side_that_is_low():
    found = {c.name: c for c in _losses([_FLOAT16_LOSS, 2.5], [_FLOAT32_LOSS, 2.50071001052856])}
    cause = found["loss_dtype_differs"]
    assert "every loss of the reference is a float16 value and the candidate's are not" in cause.evidence
    assert "torch.autocast runs a loss such as cross_entropy in float32" in cause.explanation


def test_losses_that_differ_in_float32_on_both_sides_are_no_loss_dtype_cause():
    assert "loss_dtype_differs" not in _names(_losses([_FLOAT32_LOSS, 2.5007], [1.6559401, 2.5007]))


def test_whole_number_losses_say_nothing_about_their_dtype():
    assert "loss_dtype_differs" not in _names(_losses([0.0, 1.0], [_FLOAT32_LOSS, 1.0]))


def _first(phase="forward", dtypes=("float32", "float16")):
    return ModuleDiff(
        phase=phase,
        module="inner.0.linear",
        rank=0,
        order=0,
        max_abs=1e-3,
        max_rel=1e-3,
        max_ulp=8.0,
        mismatched=4,
        numel=4,
        dtypes=dtypes,
    )


def _autocast(reference, candidate, first):
    """``forward.autocast_differs`` on step 0 of the two runs, localized at ``first``."""
    evidence = Evidence(
        reference=reference.steps[0],
        candidate=candidate.steps[0],
        failed=frozenset(),
        world_size=len(candidate.steps[0].losses),
        grads_compared=True,
        localization=Localization(step=0, first=first),
    )
    return forward.autocast_differs(evidence)


def test_a_forward_output_in_float16_against_float32_with_equal_parameters_is_a_forgotten_autocast():
    cause = _autocast(run(step(0)), run(step(0)), _first())
    assert cause is not None and cause.name == "autocast_differs"
    assert cause.evidence.startswith(
        "inner.0.linear's forward output at step 0 is float16 in the candidate and float32 in the reference"
    )


def test_an_output_dtype_explained_by_a_parameter_in_another_dtype_is_left_to_dtype_differs():
    half = step(0)
    half = replace_step(half, params={name: value.half() for name, value in half.params.items()})
    assert _autocast(run(step(0)), run(half), _first()) is None


def test_outputs_of_the_same_dtype_or_in_backward_are_no_autocast_cause():
    same = run(step(0))
    assert _autocast(same, same, _first(dtypes=None)) is None
    assert _autocast(same, same, _first(phase="backward")) is None
    assert _autocast(same, same, _first(dtypes=("float32", "float64"))) is None
