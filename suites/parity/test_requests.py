"""A rank keeps a finished reference only for a later configuration that reads it: the runner
sends each configuration with whether the rest of its run does (``ranks/requests.py``)."""

from __future__ import annotations

from harness.parity.plan.config import Layout, ParityConfig, Precision
from harness.parity.ranks import entry, requests
from harness.parity.ranks.wire import RankRow

FP32 = ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=True))
BF16 = FP32.with_(precision="bf16")
"""Mixed precision: its float32 twin is :data:`FP32`'s reference."""
KEEP = ParityConfig(engine="fsdp2", layout=Layout(reshard_after_forward=False))
"""Another candidate of :data:`FP32`'s reference."""


def test_the_configurations_share_the_references_these_tests_rely_on():
    assert FP32.reference_key() == KEEP.reference_key() == requests.twin_key(BF16)
    assert BF16.precision == Precision(dtype="bf16")


def test_a_reference_is_sent_as_kept_only_while_a_later_configuration_reads_it():
    sent = requests.requests([FP32, BF16, KEEP])
    assert [(r.config.id, r.reference_reused, r.twin_reused) for r in sent] == [
        (FP32.id, True, False),
        (BF16.id, False, True),
        (KEEP.id, False, False),
    ]


def test_a_configuration_without_a_mixed_precision_twin_has_no_twin_key():
    assert requests.twin_config(FP32) is None and requests.twin_key(FP32) is None


def _run_as_sent(configs: list[ParityConfig]) -> tuple[list[RankRow], int]:
    entry.forget()
    try:
        rows = entry.run_batch(requests.requests(configs))
        return rows, len(entry.kept_references().runs)
    finally:
        entry.forget()


def test_a_reference_is_shared_while_read_and_let_go_after_its_last_reader(ranks):
    per_rank = ranks.run(_run_as_sent, [FP32, BF16, KEEP], world_size=2)
    for rows, kept in per_rank:
        assert [row.reference_reused for row in rows] == [False, False, True]
        assert all(not row.failed for row in rows), [row.id for row in rows if row.failed]
        assert kept == 0, f"{kept} reference(s) kept after the last configuration that reads them"


def test_a_reference_no_later_configuration_reads_is_not_kept(ranks):
    per_rank = ranks.run(_run_as_sent, [BF16], world_size=2)
    for rows, kept in per_rank:
        assert not rows[0].reference_reused and kept == 0
