"""The resume causes, from hand-made records (no ranks): each lost state is named from the
candidate's audit of the resumed step, and nothing is named where the audit found nothing."""

from fixtures.parity_records import replace_step, run, step
from harness.parity.judge import causes
from harness.parity.judge.compare import compare_runs
from harness.parity.plan import profiles
from harness.parity.ranks.measure.record import RunRecord
from harness.parity.ranks.wire import ResumeAudit


def _audit(restored=None, *, at_forward=True, at=1):
    lost = {group: tuple(names) for group, names in (restored or {}).items()}
    return ResumeAudit(step=at, restored=lost, weights_at_forward=at_forward)


def _names(*audits, weight=1.5):
    """The causes named for a candidate that diverges (weights) at step 1, the resumed step."""
    ref = run(step(0), step(1))
    cand = run(step(0), replace_step(step(1, weight=weight), resume=audits), role="candidate")
    return [c.name for c in causes.match(ref, cand, compare_runs(ref, cand, profile=profiles.EXACT))]


def test_lost_optimizer_moments_are_named_optimizer_not_restored_not_step_counter():
    lost = {"optimizer": ["layer.weight:exp_avg"], "optimizer_step": ["layer.weight:step"]}
    names = _names(_audit(lost), _audit(lost))
    assert names[0] == "resume_optimizer_not_restored"
    assert "resume_step_counter_reset" not in names


def test_a_lost_step_count_alone_is_named_step_counter_reset():
    assert (
        _names(_audit({"optimizer_step": ["layer.weight:step"]}), _audit())[0] == "resume_step_counter_reset"
    )


def test_weights_restored_at_the_load_but_not_at_the_forward_are_named_weights_late():
    assert _names(_audit(at_forward=False), _audit(at_forward=False))[0] == "resume_weights_late"


def test_weights_lost_at_the_load_are_named_not_restored_and_not_late():
    names = _names(_audit({"weights": ["layer.weight"]}, at_forward=False), _audit(at_forward=False))
    assert names[0] == "resume_weights_not_restored" and "resume_weights_late" not in names


def test_saved_values_found_in_other_places_are_named_shard_misplaced_not_weights_lost():
    names = _names(_audit({"misplaced": ["layer.weight"]}, at_forward=None), _audit(at_forward=None))
    assert names[0] == "resume_shard_misplaced" and "resume_weights_not_restored" not in names


def test_an_audit_that_found_everything_restored_names_no_resume_cause():
    assert not [n for n in _names(_audit(), _audit()) if n.startswith("resume_")]


def test_a_row_without_a_resume_names_no_resume_cause():
    assert not [n for n in _names() if n.startswith("resume_")]


def test_the_evidence_quotes_three_names_per_rank_and_counts_the_rest():
    lost = {"optimizer": [f"w{i}:momentum_buffer" for i in range(5)]}
    ref = run(step(0), step(1))
    cand = run(step(0), replace_step(step(1, weight=1.5), resume=(_audit(lost), None)), role="candidate")
    (cause,) = [
        c
        for c in causes.match(ref, cand, compare_runs(ref, cand, profile=profiles.EXACT))
        if c.name.startswith("resume_")
    ]
    assert "rank 0: w0:momentum_buffer, w1:momentum_buffer, w2:momentum_buffer and 2 more" in cause.evidence
    assert "rank 1" not in cause.evidence


def test_a_later_divergence_still_finds_the_audit_and_counts_the_steps_since_the_resume():
    ref = run(step(0), step(1), step(2))
    audit = _audit({"schedulers": ["scheduler 0: last_epoch 1 (saved 1)"]})
    cand = run(
        step(0),
        replace_step(step(1), resume=(audit, audit)),
        replace_step(step(2, weight=1.5), resume=(audit, audit)),
        role="candidate",
    )
    (cause,) = [
        c
        for c in causes.match(ref, cand, compare_runs(ref, cand, profile=profiles.EXACT))
        if c.name.startswith("resume_")
    ]
    assert cause.name == "resume_scheduler_not_restored"
    assert "first diverges at step 2 (1 step(s) after resuming)" in cause.evidence


def test_the_audit_travels_with_the_record():
    record = run(replace_step(step(0), resume=(_audit(), None)), role="candidate")
    assert RunRecord.from_wire(record.to_wire()).steps[0].resume == (_audit(), None)
