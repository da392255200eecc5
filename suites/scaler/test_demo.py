"""``python -m scaler.demo`` works for any valid input and refuses bad input with argparse's errors."""

import pytest

from scaler import demo


@pytest.mark.parametrize("steps", [1, 5, 7, 12])
def test_the_demo_succeeds_for_any_number_of_steps(capsys, steps):
    assert demo.main(["--steps", str(steps)]) == 0
    assert f"{steps} steps" in capsys.readouterr().out


def test_the_demo_shows_skips_then_growth_and_a_falling_loss(capsys):
    assert demo.main(["--steps", "40"]) == 0
    out = capsys.readouterr().out
    assert "yes" in out and "40 steps, " in out


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--init-scale", "-1"], "--init-scale must be a finite number > 0, got -1.0"),
        (["--init-scale", "inf"], "--init-scale must be a finite number > 0, got inf"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--growth-interval", "0"], "--growth-interval must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_argparse_errors_naming_the_argument(capsys, args, complaint):
    with pytest.raises(SystemExit) as exit_:
        demo.main(args)
    assert exit_.value.code == 2 and complaint in capsys.readouterr().err
