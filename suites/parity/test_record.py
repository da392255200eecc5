"""Records cross the process boundary as plain data and are keyed by (rank, step), not arrival."""

import dataclasses

import pytest
import torch

from fixtures.parity_records import run, step
from harness.parity.ranks.measure.record import RunRecord, merge_rank_runs, rank_run, rank_step
from harness.parity.ranks.wire import StepTensors


def test_round_trip_keeps_every_field():
    original = dataclasses.replace(
        run(step(0), step(1, skipped=True)), counters=({"steps": 2},), error="boom", duration_s=1.5
    )
    back = RunRecord.from_wire(original.to_wire())
    assert [f.name for f in dataclasses.fields(back)] == [f.name for f in dataclasses.fields(original)]
    assert (back.role, back.description, back.counters, back.error, back.duration_s) == (
        original.role,
        original.description,
        original.counters,
        original.error,
        original.duration_s,
    )
    for got, want in zip(back.steps, original.steps, strict=True):
        for field in dataclasses.fields(want):
            a, b = getattr(got, field.name), getattr(want, field.name)
            if isinstance(b, dict):
                assert a.keys() == b.keys(), field.name
            elif field.name == "buffers":  # by rank, by name
                assert [own.keys() for own in a] == [own.keys() for own in b] and len(b) == 2
                assert all(torch.equal(x[n], y[n]) for x, y in zip(a, b, strict=True) for n in y)
            else:
                assert a == b, field.name
        assert torch.equal(got.params["layer.weight"], want.params["layer.weight"])


def _part(rank, steps, error=None):
    sent = [
        rank_step(
            loss=float(rank),
            scale=4.0,
            tracker=s,
            found_inf=[0.0],
            skipped=[False],
            tensors=StepTensors(params={}, grads={}, optim_state={}) if rank == 0 else None,
        )
        for s in range(steps)
    ]
    return rank_run(
        rank=rank, steps=sent, counters={"steps": steps}, error=error, duration_s=0.1 * (rank + 1)
    )


def test_merging_orders_by_rank_whatever_the_arrival_order():
    merged = merge_rank_runs("candidate", "c", [_part(1, 2), _part(0, 2)])
    assert [s.losses for s in merged.steps] == [(0.0, 1.0), (0.0, 1.0)]
    assert merged.counters == ({"steps": 2}, {"steps": 2}) and merged.duration_s == 0.2


def test_a_run_that_failed_on_one_rank_keeps_the_steps_every_rank_finished_and_the_error():
    merged = merge_rank_runs("candidate", "c", [_part(0, 3), _part(1, 1, error="[rank 1] RuntimeError: x")])
    assert len(merged.steps) == 1 and merged.error == "[rank 1] RuntimeError: x"


def test_merging_refuses_a_missing_rank():
    with pytest.raises(AssertionError, match="expected one part per rank, got ranks \\[0, 2\\]"):
        merge_rank_runs("candidate", "c", [_part(0, 1), _part(2, 1)])
