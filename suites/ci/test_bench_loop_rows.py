"""``make bench`` says what the default matrix's loop rows cost, by feature (issue 24)."""

import types

from ci.bench import parity_wall
from harness.parity.plan.matrices import default as matrix


def test_the_loop_rows_are_counted_and_timed_by_feature():
    outcomes = [
        types.SimpleNamespace(result=types.SimpleNamespace(config=c, time_s=0.5))
        for c in matrix.default_matrix()
    ]
    found = parity_wall.loop_rows(outcomes)
    assert set(found) == {"clip", "accumulate", "checkpoint"}
    assert found["accumulate"] == {"rows": 3, "time_s": 1.5}
