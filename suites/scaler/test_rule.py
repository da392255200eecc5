"""The loss-scale rule, one step at a time (jmp-style): backoff, growth at the interval, bounds."""

import math

import pytest
import torch

from scaler import ScaleConfig, ScalerArgumentError, ScaleState, next_scale_state

CLEAN = torch.tensor(0.0)
OVERFLOW = torch.tensor(1.0)


def advance(state: ScaleState, flags: list[torch.Tensor], config: ScaleConfig) -> list[tuple[float, int]]:
    seen = []
    for flag in flags:
        state = next_scale_state(state, flag, config)
        seen.append((state.scale.item(), int(state.growth_tracker.item())))
    return seen


def test_growth_happens_exactly_at_the_interval():
    config = ScaleConfig(growth_interval=3)
    seen = advance(ScaleState.initial(8.0), [CLEAN] * 6, config)
    assert seen == [(8.0, 1), (8.0, 2), (16.0, 0), (16.0, 1), (16.0, 2), (32.0, 0)]


def test_overflow_backs_off_and_resets_the_tracker():
    config = ScaleConfig(growth_interval=3)
    seen = advance(ScaleState.initial(8.0), [CLEAN, CLEAN, OVERFLOW, CLEAN], config)
    assert seen == [(8.0, 1), (8.0, 2), (4.0, 0), (4.0, 1)]


def test_any_nonzero_found_inf_counts_as_overflow():
    state = next_scale_state(ScaleState.initial(8.0), torch.tensor(2.0), ScaleConfig())
    assert state.scale.item() == 4.0


def test_growth_that_would_overflow_float32_keeps_the_scale_and_resets_the_tracker():
    largest_power = 2.0**127  # 2**128 is not finite in float32
    state = next_scale_state(ScaleState.initial(largest_power), CLEAN, ScaleConfig(growth_interval=1))
    assert state.scale.item() == largest_power
    assert math.isfinite(state.scale.item())
    assert state.growth_tracker.item() == 0


def test_next_scale_state_leaves_its_input_untouched():
    start = ScaleState.initial(8.0)
    next_scale_state(start, OVERFLOW, ScaleConfig())
    assert (start.scale.item(), start.growth_tracker.item()) == (8.0, 0)


def test_max_scale_caps_growth():
    config = ScaleConfig(growth_interval=1, max_scale=20.0)
    assert [s for s, _ in advance(ScaleState.initial(8.0), [CLEAN] * 3, config)] == [16.0, 20.0, 20.0]


def test_min_scale_floors_backoff():
    config = ScaleConfig(min_scale=3.0)
    assert [s for s, _ in advance(ScaleState.initial(8.0), [OVERFLOW] * 3, config)] == [4.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"growth_factor": 1.0}, "growth_factor must be > 1.0, got 1.0"),
        ({"backoff_factor": 1.0}, r"backoff_factor must be in \(0, 1\), got 1.0"),
        ({"backoff_factor": 0.0}, "backoff_factor must be a finite number > 0, got 0.0"),
        ({"growth_interval": 0}, "growth_interval must be >= 1, got 0"),
        ({"min_scale": float("nan")}, "min_scale must be a finite number > 0, got nan"),
        ({"min_scale": 8.0, "max_scale": 4.0}, r"min_scale \(8.0\) must be <= max_scale \(4.0\)"),
    ],
)
def test_config_rejects_out_of_range_values_naming_the_argument(kwargs, message):
    with pytest.raises(ScalerArgumentError, match=message):
        ScaleConfig(**kwargs)


def test_config_rejects_a_non_integer_growth_interval():
    with pytest.raises(TypeError, match="growth_interval must be an int, got float"):
        ScaleConfig(growth_interval=2.5)


def test_argument_errors_are_also_assertion_errors_like_torchs():
    with pytest.raises(AssertionError):
        ScaleConfig(growth_factor=0.5)
