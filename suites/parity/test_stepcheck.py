"""Comparing where the data lives: each rank's pieces of the candidate cover every tensor once,
the verdicts do not depend on whether the reference was kept or run in lockstep, and a reference
run in lockstep holds one step at a time."""

from __future__ import annotations

import gc
import math
import os
import weakref

import pytest
import torch
import torch.distributed as dist

from fixtures import candidate_steps
from harness.parity.judge import result as results
from harness.parity.plan.config import Fault, Layout, Loop, ParityConfig, Precision
from harness.parity.ranks import entry, requests
from harness.parity.ranks.measure import local, stepcheck
from harness.parity.ranks.wire import RankRow, RankStep, StepTensors

ENGINES = [
    ParityConfig(
        engine="fsdp2", optimizer="adam", workload="uneven", layout=Layout(reshard_after_forward=True)
    ),
    ParityConfig(
        engine="fsdp1",
        optimizer="adam",
        workload="uneven",
        layout=Layout(sharding="full_shard", use_orig_params=False),
    ),
    ParityConfig(
        engine="fsdp1",
        optimizer="sgd",
        workload="uneven",
        layout=Layout(sharding="full_shard", use_orig_params=True),
    ),
    ParityConfig(engine="fsdp1", optimizer="sgd", layout=Layout(sharding="no_shard", use_orig_params=False)),
    ParityConfig(engine="ddp", optimizer="adam"),
]


def _pieces_after_one_step(config: ParityConfig) -> dict[str, list[tuple[int, int, bool]]]:
    """Per tensor, this rank's ``(start, numel, equal to the same elements of the full gather)``."""
    engine, optimizer = candidate_steps.after_backward(config)
    grads, _ = local.grads(engine, None)  # every rank holds every gradient here
    full_grads = engine.full_grads()
    optimizer.step()
    params, state, _ = local.params_and_state(engine, [optimizer])
    full_params, full_state = engine.full_after_step([optimizer])
    wholes = {
        **{f"grad {n}": t for n, t in full_grads.items()},
        **{f"param {n}": t for n, t in full_params.items()},
        **{f"state {n}": t for n, t in stepcheck.flat_state(full_state).items()},
    }
    pieces = {
        **{f"grad {n}": p for n, p in grads.items()},
        **{f"param {n}": p for n, p in params.items()},
        **{f"state {n}": p for n, p in state.items()},
    }
    assert set(pieces) == set(wholes), set(pieces) ^ set(wholes)
    found = {}
    for name, piece in pieces.items():
        whole = wholes[name]
        assert piece.shape == tuple(whole.shape) and piece.dtype == whole.dtype, name
        if piece.values is None:
            found[name] = []
            continue
        same = whole.reshape(-1)[piece.start : piece.start + piece.numel].to(piece.dtype)
        found[name] = [(piece.start, piece.numel, torch.equal(same, piece.values.cpu()))]
    return {**found, "_numel": {name: whole.numel() for name, whole in wholes.items()}}


@pytest.mark.parametrize("config", ENGINES, ids=lambda c: c.id)
def test_each_element_of_every_tensor_is_compared_by_exactly_one_rank(ranks, config):
    per_rank = ranks.run(_pieces_after_one_step, config, world_size=2)
    numel = per_rank[0]["_numel"]
    for name, total in numel.items():
        runs = sorted(run for found in per_rank for run in found[name])
        covered = 0
        for start, count, equal in runs:
            assert start == covered, f"{name}: pieces {runs} leave a gap or overlap at {covered}"
            assert equal, f"{name}: the piece at {start} is not the full tensor's elements there"
            covered += count
        assert covered == total, f"{name}: pieces cover {covered} of {total} elements"


CONFIGS = [
    ParityConfig(engine="fsdp2", optimizer="adam", layout=Layout(reshard_after_forward=True)),
    ParityConfig(
        engine="fsdp1",
        optimizer="sgd",
        layout=Layout(sharding="full_shard", use_orig_params=True),
        precision=Precision(dtype="bf16"),
    ),
    ParityConfig(
        engine="fsdp2",
        optimizer="sgd",
        layout=Layout(reshard_after_forward=False),
        precision=Precision(dtype="fp16"),
    ),
    ParityConfig(
        engine="fsdp1",
        suite="forced_inf",
        faults=(Fault(step=2),),
        layout=Layout(sharding="shard_grad_op", use_orig_params=False),
    ),
]


def _run_with_budget(configs: list[ParityConfig], mib: str) -> list[RankRow]:
    entry.forget()
    before = os.environ.get(requests.KEEP_ENV)
    os.environ[requests.KEEP_ENV] = mib
    try:
        return entry.run_batch(configs)
    finally:
        entry.forget()
        if before is None:
            del os.environ[requests.KEEP_ENV]
        else:
            os.environ[requests.KEEP_ENV] = before


def _verdicts(per_rank: list[list[RankRow]]) -> list[tuple]:
    found = []
    for index, config in enumerate(CONFIGS):
        verdict, _, _ = results.judge(config, [rank[index] for rank in per_rank])
        found.append(
            (
                verdict.status,
                verdict.reason,
                verdict.divergences,
                verdict.worst,
                verdict.max_ulp,
                verdict.distances,
                verdict.causes,
                verdict.expected_gap,
                verdict.curves,
            )
        )
    return found


def test_a_reference_too_large_to_keep_gives_the_verdicts_of_a_kept_one(ranks):
    kept = ranks.run(_run_with_budget, CONFIGS, "512", world_size=2)
    lockstep = ranks.run(_run_with_budget, CONFIGS, "0", world_size=2)
    assert _verdicts(lockstep) == _verdicts(kept)
    assert [v[0] for v in _verdicts(kept)] == ["pass"] * len(CONFIGS)
    assert all(result.reference_reused is False for rank in lockstep for result in rank)


class _Step(dict):
    """A recorded step that can be watched for being freed."""


def test_a_reference_compared_in_lockstep_holds_only_the_step_being_compared():
    made: list[weakref.ref] = []

    def run():
        for index in range(5):
            step = _Step(index=index)
            made.append(weakref.ref(step))
            yield step

    steps = stepcheck.ReferenceSteps([], live=run())
    for index in range(5):
        assert steps.step(index)["index"] == index
        gc.collect()
        alive = [ref()["index"] for ref in made if ref() is not None]
        assert alive == [index], f"at step {index} the reference still holds steps {alive}"


def test_a_kept_reference_serves_every_step_again():
    steps = stepcheck.ReferenceSteps([{"index": 0}, {"index": 1}])
    assert [steps.step(i)["index"] for i in (0, 1, 0, 1)] == [0, 1, 0, 1]
    assert steps.step(2) is None


def test_a_keep_budget_that_is_not_a_number_of_mib_names_the_variable(monkeypatch):
    monkeypatch.setenv(requests.KEEP_ENV, "lots")
    with pytest.raises(ValueError, match=f"{requests.KEEP_ENV} must be a number of MiB"):
        entry.keep_budget()


class _FakeEngine:
    """What ``stepcheck.Check`` asks of an engine, on one process: a weight and its gradient."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.grad = torch.zeros(4)
        self.param = torch.zeros(4)

    gathered = 0

    def full_grads(self, copy: bool = True) -> dict[str, torch.Tensor]:
        self.gathered += 1
        return {"w": self.grad.clone()}

    def full_after_step(self, _optimizers) -> tuple[dict, dict]:
        return {"w": self.param.clone()}, {}

    def own_buffers(self) -> dict[str, torch.Tensor]:
        return {}


def _reference_step(value: float) -> RankStep:
    tensors = StepTensors(
        grads={"w": torch.full((4,), value)}, params={"w": torch.full((4,), value)}, optim_state={}
    )
    return RankStep(loss=1.0, scale=1.0, tracker=0, found_inf=(0.0,), skipped=(False,), tensors=tensors)


_TINY = 2.0**-23  # one float32 ulp at 1.0: within the fp32 profile, not bitwise
_STEPS = [(0.0, 0.0), (_TINY, 0.0), (_TINY * 2, 0.0), (_TINY * 3, 1.0), (_TINY, 2.0)]
"""(gradient offset, parameter offset) by step: step 0 equal; step 1 the gradients differ within
the profile (the origin); step 2 they still do; step 3 the parameters fail; step 4 they fail again."""


def _checked(monkeypatch) -> tuple[stepcheck.Check, _FakeEngine, dict[int, RankStep]]:
    """Every step of :data:`_STEPS` checked; the records whose tensors travel, by step."""
    engine = _FakeEngine()
    monkeypatch.setattr(
        local,
        "grads",
        lambda e, scale: ({"w": local.Piece((4,), torch.float32, 0, e.grad.view(-1))}, {"w": True}),
    )
    monkeypatch.setattr(
        local,
        "params_and_state",
        lambda e, opts: ({"w": local.Piece((4,), torch.float32, 0, e.param.clone())}, {}, None),
    )
    reference = stepcheck.ReferenceSteps([_reference_step(1.0) for _ in _STEPS])
    check = stepcheck.Check(
        ParityConfig(  # clipped under FSDP: held to the fp32 profile (the clip-order fallback)
            engine="fsdp2",
            layout=Layout(reshard_after_forward=True),
            loop=Loop(path="unscale_clip", clip=0.05),
        ),
        reference,
    )
    sent = {}
    for step, (grad_off, param_off) in enumerate(_STEPS):
        engine.grad = torch.full((4,), 1.0 + grad_off)
        engine.param = torch.full((4,), 1.0 + param_off)
        check.begin(step)
        check.grads(step, engine, None)
        engine.grad.add_(1.0)  # the optimizer step may change the gradients it read
        record = RankStep(loss=1.0, scale=1.0, tracker=0, found_inf=(0.0,), skipped=(False,))
        checked = check.after_step(step, engine, [], record)
        if checked.tensors is not None:
            sent[step] = checked
    return check, engine, sent


def test_full_tensors_travel_for_the_origin_and_the_first_failing_step_only(monkeypatch):
    check, _, sent = _checked(monkeypatch)
    assert sorted(sent) == [1, 3]
    assert sorted(check.kept) == [1, 3]


def test_differing_gradients_past_the_origin_are_gathered_only_where_they_travel(monkeypatch):
    _, engine, sent = _checked(monkeypatch)
    assert engine.gathered == 1  # the origin's; step 2's differ but do not travel
    assert sent[3].tensors.grads["w"].tolist() == [1.0 + _TINY * 3] * 4  # as measured, before the step


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}
    return tensor.view(ints.get(tensor.dtype, torch.int16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_unscaled_in_their_own_dtype_round_as_through_float64(dtype):
    """A power-of-two scale divided out in float32 gives the float64 route's bits, subnormals too."""
    grads = torch.randn(20_000, dtype=torch.float64) * torch.logspace(-45, 38, 20_000, dtype=torch.float64)
    grads = grads.to(dtype)
    for scale in (2.0**16, 2.0**24, 2.0**-3):
        fast = stepcheck.unscaled({"w": grads.clone()}, scale)["w"]
        assert torch.equal(_bits(fast), _bits((grads.double() / scale).to(dtype)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_16_bit_gradient_unscaled_rounds_as_through_float64(dtype):
    """Every finite value of the dtype, at the scales a run reaches: the float32 division inside
    torch's 16-bit one never rounds twice where it matters."""
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    every = every[every.isfinite()]
    for scale in (2.0, 2.0**8, 2.0**16, 2.0**24, 2.0**30):
        got = stepcheck.unscaled({"w": every.clone()}, scale)["w"]
        assert got.dtype == dtype
        assert torch.equal(_bits(got), _bits((every.double() / scale).to(dtype)))


def test_a_scale_of_one_leaves_the_gradients_as_they_are():
    grads = torch.randn(8)
    assert stepcheck.unscaled({"w": grads}, 1.0)["w"] is grads


def _whole_of_two_ranks_pieces() -> dict[str, object] | None:
    rank, full = dist.get_rank(), torch.arange(5.0)
    values = full[:3] if rank == 0 else full[3:]
    pieces = {
        "w": local.Piece((5,), torch.float32, 0 if rank == 0 else 3, values),
        "b": local.Piece((), torch.float32, 0, torch.tensor([7.0]) if rank == 0 else None),
    }
    whole = stepcheck.whole_on_rank_zero(pieces, rank)
    return None if whole is None else {name: value.tolist() for name, value in whole.items()}


def test_pieces_kept_on_each_rank_come_whole_to_rank_zero(ranks):
    assert ranks.run(_whole_of_two_ranks_pieces, world_size=2) == [
        {"w": [0.0, 1.0, 2.0, 3.0, 4.0], "b": 7.0},
        None,
    ]


_FINITE_CASES = {
    "finite": torch.randn(1000),
    "finite-overflowing-their-sum": torch.tensor([3e38, 3e38, -1.0]),
    "fp16-finite-overflowing-their-sum": torch.tensor([60000.0, 60000.0], dtype=torch.float16),
    "bf16-finite": torch.randn(1000).to(torch.bfloat16),
    "an-infinity": torch.tensor([1.0, math.inf, 2.0]),
    "a-negative-infinity": torch.tensor([1.0, -math.inf]),
    "both-infinities": torch.tensor([math.inf, -math.inf]),
    "a-nan": torch.tensor([1.0, math.nan]),
    "fp16-infinity": torch.tensor([1.0, math.inf], dtype=torch.float16),
    "empty": torch.empty(0),
    "integers": torch.tensor([1, 2, 3]),
}


@pytest.mark.parametrize("name", sorted(_FINITE_CASES))
def test_all_finite_says_what_the_element_mask_says(name):
    tensor = _FINITE_CASES[name]
    assert stepcheck.all_finite(tensor) is bool(tensor.isfinite().all())


def test_all_finite_writes_no_mask_of_every_element_when_their_sum_is_finite(monkeypatch):
    """The reference's overflow check runs every step on a share of its gradients: a finite sum
    answers it, and only a 0-d tensor is ever tested element by element."""
    tested = []
    isfinite = torch.Tensor.isfinite

    def counted(tensor):
        tested.append(tensor.numel())
        return isfinite(tensor)

    monkeypatch.setattr(torch.Tensor, "isfinite", counted)
    assert stepcheck.all_finite(torch.randn(10_000))
    assert tested == [1]
