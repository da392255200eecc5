"""What crosses from the ranks to the judge (``harness/parity/ranks/wire.py``): frozen records that
survive the pool's pickling whole, and no string-keyed dict of ``Any`` in their place.

Why by pickle: a rank's return value travels pickled by the standard pickler (tensors by value),
so a record must come back with every field; a field a record drops or renames would otherwise
show only as a verdict that reads a default. Why by annotations: the runner calls the rank
functions by name, so nothing but this test ties what they return to what the judge reads.
"""

from __future__ import annotations

import dataclasses
import pickle
import types
import typing
from typing import Any

import pytest
import torch

from harness.parity.doors import reshard, runner
from harness.parity.judge import pinpoint, result, staged
from harness.parity.ranks import wire
from harness.parity.ranks.measure import gap, record

_T = torch.tensor([1.0, -2.0, 0.5, 3.0])

_PARTIAL = wire.Partial(max_abs=0.5, max_rel=0.25, mismatched=3, numel=8, max_ulp=2.0)
_TENSORS = wire.StepTensors(
    params={"w": _T.clone()},
    grads={"w": _T * 2},
    optim_state={"w": {"exp_avg": _T.half(), "step": torch.tensor(3.0)}},
)
_AUDIT = wire.ResumeAudit(
    step=2,
    restored={"optimizer": ("w:exp_avg", "w:exp_avg_sq")},
    weights_at_forward=False,
    world_sizes=(4, 2),
)
_STEP = wire.RankStep(
    loss=0.75,
    scale=1024.0,
    tracker=3,
    found_inf=(0.0, 1.0),
    skipped=(False, None),
    tensors=_TENSORS,
    buffers={"bn.running_mean": _T.double()},
    clip_norm=0.125,
    accumulated_in="float32",
    checkpoint="replay",
    compiled="3 modules, inductor",
    meta={
        "grad": {"w": ((4,), torch.float32)},
        "buffer": {"bn.running_mean [rank 1]": ((4,), torch.float64)},
    },
    diffs={"grad": {"w": _PARTIAL}},
    grad_squares={"w": 14.25},
    resume=_AUDIT,
)
_RUN = wire.RankRun(
    rank=1,
    steps=(_STEP, _STEP),
    counters={"steps": 2, "growths": 1},
    error=None,
    duration_s=1.5,
    compile_s=0.5,
    facts=wire.FunctionFacts(
        never_reduced=("embed.weight",),
        split_ties=("lm_head.weight = embed.weight",),
        stage_ties=(("embed.weight", "output.weight"),),
        pipeline=("looped_bfs", 4, True),
    ),
)
_GAP = wire.Gap(loss_max_abs=0.1, loss_max_rel=0.2, param_max_abs=0.3, param_max_rel=0.4)
_COMPARED = wire.Compared(elements=8, differing=2, max_ulp=3.0)
_BOUNDED = wire.Bounded(elements=8, violations=1, worst_ratio=1.5)
_STAGED_STEP = wire.StagedStep(
    loss=(1.5, 1.25),
    local={"w": _COMPARED},
    poisoned=True,
    reduction={"w": _BOUNDED},
    reduction_names=(("w",), ("v",)),
    reordered=5,
    clip=(0.5, 0.25),
    update={"param:w": _COMPARED},
    buffers={"bn.running_mean": _COMPARED},
    scale=(2.0, 4.0),
    tracker=(1, 0),
)
_SIDE = wire.ProbedSide(forward=(("inner.0", _T.clone()), ("inner", _T * 3)), backward=(("inner", _T - 1),))
_OPS = wire.ProbedOps(
    module="inner.0", reference=(("aten.addmm.default", _T.clone()),), candidate=(("aten.mm.default", _T),)
)

_TRUTH_STEP = wire.TruthStep(
    step=2,
    distance=0.04,
    rounding=3e-16,
    pieces=("rank 0 microbatch 0", "rank 1 microbatch 0"),
    counts=(30, 27),
    counted="items",
    repeats=("rank 1 microbatch 0 row 3 = rank 0 microbatch 0 row 0",),
    as_served=1e-16,
    weights=(0.53, 0.47),
    weights_residual=4e-16,
    factor=0.5,
    module=("blocks.1.norm", "BatchNorm1d", 0.4),
)
SAMPLES: dict[type, Any] = {
    wire.Partial: _PARTIAL,
    wire.StepTensors: _TENSORS,
    wire.ResumeAudit: _AUDIT,
    wire.RankStep: _STEP,
    wire.FunctionFacts: _RUN.facts,
    wire.RankRun: _RUN,
    wire.Gap: _GAP,
    wire.RankRow: wire.RankRow(
        id="fsdp2-fp32-sgd-w2",
        reference=dataclasses.replace(_RUN, error="[rank 1] RuntimeError: boom"),
        reference_description="DDP",
        candidate=_RUN,
        candidate_description="FSDP2",
        reference_reused=True,
        fp32_gap=_GAP,
        part=2,
    ),
    wire.Compared: _COMPARED,
    wire.Bounded: _BOUNDED,
    wire.StagedStep: _STAGED_STEP,
    wire.StagedRun: wire.StagedRun(
        id="row", rank=3, steps=(_STAGED_STEP,), error="[rank 3] boom", drift=(0.0, 2.0), duration_s=0.5
    ),
    wire.ProbedSide: _SIDE,
    wire.ProbedOps: _OPS,
    wire.Probed: wire.Probed(
        id="row",
        step=1,
        reference=_SIDE,
        candidate=wire.ProbedSide(forward=(), backward=()),
        ops=_OPS,
        error="[rank 0] the candidate raised",
        duration_s=0.25,
    ),
    wire.TruthStep: _TRUTH_STEP,
    wire.TruthRun: wire.TruthRun(
        split="2 data-parallel ranks x 2 microbatches",
        steps=(_TRUTH_STEP,),
        unsupported="a forward that draws random numbers",
        error="[rank 1] boom",
        duration_s=0.5,
        parameters=1234,
    ),
}
"""One record of every type, every field set (a field with a default: not to its default)."""


def _records() -> list[type]:
    return [
        value for value in vars(wire).values() if isinstance(value, type) and dataclasses.is_dataclass(value)
    ]


def _same(a: Any, b: Any) -> bool:
    """Equal all the way down: tensors by dtype, shape and value, records field by field."""
    if isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if dataclasses.is_dataclass(b):
        return type(a) is type(b) and all(
            _same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(b)
        )
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in b)
    if isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_every_record_has_a_sample():
    assert sorted(t.__name__ for t in _records()) == sorted(t.__name__ for t in SAMPLES)


@pytest.mark.parametrize("kind", list(SAMPLES), ids=lambda t: t.__name__)
def test_every_record_is_frozen_slotted_and_keyword_only(kind):
    params = kind.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen and "__slots__" in vars(kind), kind
    with pytest.raises(TypeError):
        kind(*[getattr(SAMPLES[kind], f.name) for f in dataclasses.fields(kind)])


@pytest.mark.parametrize("kind", list(SAMPLES), ids=lambda t: t.__name__)
def test_round_trip_keeps_every_field(kind):
    """What the pool does to a rank's return value (the standard pickler), every field kept."""
    sample = SAMPLES[kind]
    for field in dataclasses.fields(kind):
        if field.default is not dataclasses.MISSING:
            assert not _same(getattr(sample, field.name), field.default), f"{field.name} is its default"
        if field.default_factory is not dataclasses.MISSING:
            assert not _same(getattr(sample, field.name), field.default_factory()), f"{field.name} is empty"
    back = pickle.loads(pickle.dumps(sample))
    for field in dataclasses.fields(kind):
        assert _same(getattr(back, field.name), getattr(sample, field.name)), field.name


def test_a_run_record_keeps_its_resume_audits_through_its_own_wire_form():
    merged = record.merge_rank_runs("candidate", "c", [dataclasses.replace(_RUN, rank=0), _RUN])
    back = record.RunRecord.from_wire(merged.to_wire())
    assert back.steps[0].resume == (_AUDIT, _AUDIT)


# -- the boundary: no dict of Any from the ranks to the judge ----------------------------------
RANK_TARGETS = (
    runner.RANK_TARGET,
    runner.TENSORS_TARGET,
    runner.LOCALIZE_TARGET,
    runner.STAGED_TARGET,
    reshard.TARGET,
)
"""Every rank function the runner calls by name."""

CONSUMERS = {
    runner.RANK_TARGET: (result.judge, "parts"),
    runner.TENSORS_TARGET: (result.judge, "parts"),
    runner.LOCALIZE_TARGET: (pinpoint.locate, "parts"),
    runner.STAGED_TARGET: (staged.judge, "parts"),
    reshard.TARGET: (result.judge_halves, "first"),
}
"""The judge function that reads each rank function's results (every rank's, in rank order)."""

JUDGE_FUNCTIONS = (
    result.judge,
    result.judge_halves,
    result.verdict,
    staged.judge,
    pinpoint.locate,
    pinpoint.locate_op,
    record.merge_rank_runs,
    gap.merge,
)


def _loose(annotation: Any, seen: set[type] | None = None) -> list[str]:
    """Where ``annotation`` (and every record it holds, field by field) lets an untyped value
    through: ``Any``, a dict or list of ``Any``, or a bare ``dict``/``list``."""
    seen = set() if seen is None else seen
    if annotation is Any:
        return ["Any"]
    if annotation in (dict, list, tuple):
        return [f"a bare {annotation.__name__}"]
    found = []
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict and args and args[-1] is Any:
        found.append(f"{annotation}")
    elif origin is list and args == (Any,):
        found.append(f"{annotation}")
    elif origin in (dict, list, tuple, typing.Union, types.UnionType):
        for arg in args:
            found += _loose(arg, seen)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation) and annotation not in seen:
        seen.add(annotation)
        for name, hint in typing.get_type_hints(annotation).items():
            found += [f"{annotation.__name__}.{name}: {what}" for what in _loose(hint, seen)]
    return found


@pytest.mark.parametrize("target", RANK_TARGETS)
def test_the_rank_functions_the_runner_calls_return_frozen_records_not_dicts(target):
    returned = typing.get_type_hints(runner.rank_function(target))["return"]
    assert typing.get_origin(returned) is list, f"{target} returns {returned}: one record per request"
    (each,) = typing.get_args(returned)
    assert dataclasses.is_dataclass(each) and each.__dataclass_params__.frozen, f"{target} returns {returned}"
    assert each in SAMPLES, f"{target}'s {each.__name__} is not a record of harness.parity.ranks.wire"
    assert _loose(returned) == [], f"{target} returns {returned}: {_loose(returned)}"


@pytest.mark.parametrize("target", RANK_TARGETS)
def test_the_judge_reads_exactly_what_each_rank_function_returns(target):
    returned = typing.get_type_hints(runner.rank_function(target))["return"]
    function, parameter = CONSUMERS[target]
    assert typing.get_type_hints(function)[parameter] == returned, (target, function.__qualname__)


@pytest.mark.parametrize("function", JUDGE_FUNCTIONS, ids=lambda f: f"{f.__module__}.{f.__qualname__}")
def test_the_judge_functions_reading_the_ranks_records_take_no_dict_of_any(function):
    hints = typing.get_type_hints(function)
    loose = {name: _loose(hint) for name, hint in hints.items() if name != "return" and _loose(hint)}
    assert loose == {}, f"{function.__qualname__} takes untyped values: {loose}"


def test_the_boundary_check_sees_a_dict_of_any_wherever_it_hides():
    @dataclasses.dataclass(frozen=True, slots=True)
    class Hidden:
        steps: tuple[dict[str, Any], ...]

    assert _loose(list[dict[str, Any]]) == ["dict[str, typing.Any]"]
    assert _loose(list[Hidden]) == ["Hidden.steps: dict[str, typing.Any]"]
    assert _loose(list[wire.RankRow] | None) == []
