"""What the report says about a planted bug is true: it names the planted place and cause, and no
rounding cause (``fixtures/diagnosis.py``: the matrix and its cases).

The fast tier runs a fixed sample: each case once, at world size 2 or 4 by turns, the precisions,
optimizers and engines turning over; the ``world_sizes`` tier runs every case in every precision
and optimizer (fused ones included) at world sizes 2, 4 and 8, and its last test prints the
accuracy (``make bench`` prints it too: ``python -m ci.bench --only diagnosis``).
"""

from __future__ import annotations

import pytest

from fixtures import diagnosis

SAMPLE_SIZES = (2, 4)
FULL_SIZES = (2, 4, 8)


@pytest.fixture(scope="module")
def sampled(module_ranks):
    """``{case: Scored}`` of the fixed sample."""
    rows = diagnosis.sample(SAMPLE_SIZES)
    return {case.name: diagnosis.scored(case, result) for case, result in diagnosis.run(module_ranks, rows)}


def _explained(found: diagnosis.Scored) -> str:
    return (
        f"{found.row}: {found.status}, place {found.where!r}, causes {list(found.causes)}, "
        f"rounding {list(found.rounding)} ({found.reason})"
    )


@pytest.mark.parametrize(
    "case", [f"{case.name}-{config.world_size}" for case, config in diagnosis.sample(SAMPLE_SIZES)]
)
def test_the_report_names_the_planted_place_and_cause(sampled, case):
    found = sampled[case.rpartition("-")[0]]
    assert found.right, _explained(found)


@pytest.fixture(scope="module")
def everything(module_ranks):
    """Every row of the matrix at world sizes 2, 4 and 8, scored."""
    rows = [row for world in FULL_SIZES for row in diagnosis.rows(world)]
    return [diagnosis.scored(case, result) for case, result in diagnosis.run(module_ranks, rows)]


@pytest.mark.world_sizes
def test_every_row_of_the_matrix_names_its_planted_place_and_cause(everything, capsys):
    """100 % on the planted place and cause, at every world size, precision and optimizer."""
    with capsys.disabled():
        print("\ndiagnosis accuracy (world sizes 2, 4, 8):\n" + diagnosis.accuracy(everything))
    wrong = [_explained(found) for found in everything if not found.right]
    assert not wrong, "\n".join(wrong)
