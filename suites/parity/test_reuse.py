"""Candidate tensors equal to the reference's travel once (``ranks/sides/full/reuse.py``): shared by object,
sent once by pickle, and never shared where they differ, so verdicts cannot change."""

import dataclasses
import pickle

import torch

from harness.parity.plan.config import Layout
from harness.parity.ranks.measure.record import rank_run, rank_step
from harness.parity.ranks.sides.full.reuse import share_equal_tensors
from harness.parity.ranks.wire import RankRow, RankRun, StepTensors


def _run(weight: torch.Tensor, steps: int = 3) -> RankRun:
    sent = [
        rank_step(
            loss=1.0,
            scale=4.0,
            tracker=0,
            found_inf=[0.0],
            skipped=[False],
            tensors=StepTensors(
                params={"w": weight.clone() + s},
                grads={"w": weight.clone() * s},
                optim_state={"w": {"exp_avg": weight.clone() - s}},
            ),
            buffers={"bn.running_mean": torch.zeros(3)},
        )
        for s in range(steps)
    ]
    return rank_run(rank=0, steps=sent, counters={}, error=None, duration_s=0.0)


def test_equal_candidate_tensors_become_the_references_objects():
    reference, candidate = _run(torch.ones(4, 4)), _run(torch.ones(4, 4))
    assert share_equal_tensors(reference, candidate) == 3 * 4
    for want, got in zip(reference.steps, candidate.steps, strict=True):
        assert got.tensors.params["w"] is want.tensors.params["w"]
        assert got.tensors.optim_state["w"]["exp_avg"] is want.tensors.optim_state["w"]["exp_avg"]
        assert got.buffers["bn.running_mean"] is want.buffers["bn.running_mean"]


def test_a_passing_run_pickles_about_the_size_of_its_reference_alone():
    reference, candidate = _run(torch.ones(64, 64)), _run(torch.ones(64, 64))
    alone = len(pickle.dumps({"reference": reference}))
    before = len(pickle.dumps({"reference": reference, "candidate": candidate}))
    share_equal_tensors(reference, candidate)
    after = len(pickle.dumps({"reference": reference, "candidate": candidate}))
    assert before > 1.9 * alone and after < 1.1 * alone, (alone, before, after)
    back = pickle.loads(pickle.dumps({"reference": reference, "candidate": candidate}))
    shared = back["candidate"].steps[1].tensors.grads["w"]
    assert shared is back["reference"].steps[1].tensors.grads["w"]


def test_differing_tensors_keep_their_own_values():
    reference, candidate = _run(torch.ones(4, 4)), _run(torch.ones(4, 4))
    candidate.steps[2].tensors.grads["w"][0, 0] += 1e-6
    candidate.steps[1].tensors.params["w"] = candidate.steps[1].tensors.params["w"].double()
    share_equal_tensors(reference, candidate)
    got, want = candidate.steps[2].tensors.grads["w"], reference.steps[2].tensors.grads["w"]
    assert got is not want and not torch.equal(got, want)
    assert candidate.steps[1].tensors.params["w"].dtype == torch.float64


def test_nan_is_never_shared():
    reference, candidate = _run(torch.full((2,), float("nan"))), _run(torch.full((2,), float("nan")))
    share_equal_tensors(reference, candidate)
    assert candidate.steps[0].tensors.params["w"] is not reference.steps[0].tensors.params["w"]


def test_a_shorter_candidate_shares_the_steps_it_has():
    reference, candidate = _run(torch.ones(2), steps=3), _run(torch.ones(2), steps=1)
    assert share_equal_tensors(reference, candidate) == 4


def _tensors_sent(value: object) -> int:
    """How many tensors ``value`` (a rank's result) holds, however deep."""
    if isinstance(value, torch.Tensor):
        return 1
    if isinstance(value, dict):
        return sum(_tensors_sent(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensors_sent(v) for v in value)
    if dataclasses.is_dataclass(value):
        return sum(_tensors_sent(getattr(value, field.name)) for field in dataclasses.fields(value))
    return 0


def _passing_fsdp2_result(keep_all: bool) -> RankRow:
    from harness.parity.plan.config import ParityConfig
    from harness.parity.ranks import entry

    config = ParityConfig(engine="fsdp2", optimizer="adam", layout=Layout(reshard_after_forward=True))
    return entry.run_one(config, keep_all=keep_all)


def _sent_by_a_passing_candidate() -> int:
    return _tensors_sent(_passing_fsdp2_result(keep_all=False))


def test_a_bitwise_passing_configuration_sends_no_tensor_from_any_rank(ranks):
    """Each rank compares where the data lives: only distances travel when nothing diverged."""
    assert ranks.run(_sent_by_a_passing_candidate, world_size=2) == [0, 0]


def _kept_candidate_shares_with_reference() -> tuple[int, int]:
    """(tensors the candidate sent on this rank with every step kept, how many of them are the
    reference's own objects)."""
    result = _passing_fsdp2_result(keep_all=True)
    total = same = 0
    assert result.candidate is not None
    for want, got in zip(result.reference.steps, result.candidate.steps, strict=True):
        if got.tensors is None:
            continue
        assert want.tensors is not None
        for mine, theirs in (
            (got.tensors.params, want.tensors.params),
            (got.tensors.grads, want.tensors.grads),
        ):
            for name, value in mine.items():
                total += 1
                same += value is theirs[name]
    return total, same


def test_rank_0_sends_kept_tensors_equal_to_the_reference_as_references_to_it(ranks):
    (total, same), (other, _) = ranks.run(_kept_candidate_shares_with_reference, world_size=2)
    assert total > 0 and same == total and other == 0, (total, same, other)
