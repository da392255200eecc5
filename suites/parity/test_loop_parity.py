"""The default matrix's loop rows (``loop_matrix.default_rows``) train like their reference: clipping
at a norm that bites, accumulating microbatches in both sync modes, checkpointing the conv net's
units under dropout. As parity configurations of the suite, the gate compares their curves with
their baselines."""

from harness.parity.plan.matrices import loop as loop_matrix
from suites.parity.support import describe

CONFIGS = loop_matrix.default_rows(world_size=2)


def test_each_loop_row_trains_like_its_reference(parity_config, outcome):
    assert outcome.result.status == "pass", describe(outcome)


def test_a_checkpointed_row_says_so_on_both_sides(parity_config, outcome):
    said = outcome.result.candidate
    if parity_config.loop.checkpoint:
        assert "units checkpointed" in said and "units checkpointed" in outcome.result.reference
