"""Every known cause's premise, tested: a cause whose pattern matches is named when what it claims
was measured, and ruled out (never named) when the row's own evidence refutes it.

One case per cause, on hand-made records (no ranks): the records match the pattern, ``holds`` is
a measurement under which the claim is true, ``refutes`` are measurements that contradict it (the
first difference measured in another stage, nothing measured from a common state, a rounding
explanation on a row the staged check did not clear, a reduction mirrored bitwise). A cause that
claims nothing about a stage (a dtype, a rank's flags, a resume audit) stands on a fact of the
records, so its case gives ``without``: the same row without that fact, where it must not be named.
``ci/mutation/premise_plants.py`` loosens each premise in turn; these tests kill each plant.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch

from fixtures.parity_records import next_float, replace_step, run, step
from harness.parity.judge import causes
from harness.parity.judge.causes import two_d
from harness.parity.judge.compare import compare_runs
from harness.parity.judge.measured import Measured
from harness.parity.judge.pinpoint import Localization, ModuleDiff
from harness.parity.plan import profiles
from harness.parity.plan.config import Layout, Mesh, ParityConfig
from harness.parity.ranks.wire import FunctionFacts, ResumeAudit

HELD = Measured(source="staged", reordered=12)
"""The staged check held at every stage, some reduced elements summed in another order."""
DRIFTED = Measured(source="", step=1, why_not="the straight runs already differed at step 0")


def _at(stage: str, source: str = "staged", reordered: int = 12) -> Measured:
    """The first difference measured in ``stage`` at step 0."""
    return Measured(source=source, step=0, stage=stage, detail=f"the {stage} differs", reordered=reordered)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    reference: list[Any]
    candidate: list[Any]
    holds: Measured | None = None
    """A measurement under which the cause is true (``None``: what the straight runs measure)."""
    refutes: tuple[Measured, ...] = ()
    without: tuple[list[Any], list[Any]] | None = None
    """The same row without the fact a self-contained cause stands on."""
    profile: Any = profiles.EXACT
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts: FunctionFacts | None = None
    """What the candidate's run says was read off its function (a user's ``parallelize``)."""


def _grads(record, **grads):
    return replace_step(record, grads={**record.grads, **grads})


def _fine(record):
    return _grads(record, **{"layer.weight": torch.tensor([[0.3, -0.7], [1.1, 2.3]])})


def _rounded(record):
    return replace_step(record, grads={n: g.bfloat16().float() for n, g in record.grads.items()})


def _module(name: str, *, phase: str = "forward", failed: bool = True, dtypes=None) -> ModuleDiff:
    return ModuleDiff(
        phase=phase,
        module=name,
        rank=0,
        order=0,
        max_abs=1e-3 if failed else 0.0,
        max_rel=1e-3 if failed else 0.0,
        max_ulp=8.0 if failed else 0.0,
        mismatched=4 if failed else 0,
        numel=4,
        dtypes=dtypes,
    )


def _audit(restored=None, *, at_forward=True):
    lost = {group: tuple(names) for group, names in (restored or {}).items()}
    return ResumeAudit(step=1, restored=lost, weights_at_forward=at_forward)


def _resumed(audit):
    return [step(0), replace_step(step(1, weight=1.5), resume=(audit, audit))]


_TP = ParityConfig(
    world_size=4, engine="fsdp2", workload="llama", mesh=Mesh(tp=2), layout=Layout(reshard_after_forward=True)
)
_PP = ParityConfig(
    world_size=2,
    engine="fsdp2",
    workload="llama",
    mesh=Mesh(pp=2),
    layout=Layout(reshard_after_forward=False),
)
_ZB = dataclasses.replace(_PP, mesh=Mesh(pp=2, schedule="zbv"), layout=Layout(reshard_after_forward=True))
_TIED = FunctionFacts(stage_ties=(("layer.weight", "head.weight"),))
_NOISY = {"layer.weight": torch.full((2, 2), 0.5), "layer.bias": torch.full((2,), 1e-9)}
_FEW_ULPS = torch.tensor([0.5, 0.00390625 + 1.5 * 2**-8])
_EQUAL_EVERYWHERE = Localization(step=0, modules=(_module("layer", failed=False),))

CASES: dict[str, Case] = {
    "forward_differs": Case(
        reference=[step(0)],
        candidate=[replace_step(step(0), losses=(0.5, 0.75))],
        refutes=(_at("reduction"), DRIFTED),
    ),
    "never_reduced": Case(
        reference=[step(0)],
        candidate=[_grads(step(0), **{"layer.bias": torch.full((2,), 0.75)})],
        facts=FunctionFacts(never_reduced=("layer.bias",)),
        holds=_at("reduction"),
        refutes=(_at("loss"), _at("local"), DRIFTED),
    ),
    "divide_factor": Case(
        reference=[step(0)],
        candidate=[_grads(step(0), **{"layer.weight": torch.full((2, 2), 0.5)})],
        holds=_at("reduction"),
        refutes=(_at("loss"), _at("local"), DRIFTED),
    ),
    "clip_norm_sharded": Case(
        reference=[replace_step(step(0), clip_norms=(2.0, 2.0))],
        candidate=[replace_step(step(0), clip_norms=(math.sqrt(2.0), math.sqrt(2.0)))],
        holds=_at("clip"),
        refutes=(_at("loss"), DRIFTED),
    ),
    "clip_unscale_order": Case(
        reference=[replace_step(step(0), clip_norms=(2.0, 2.0))],
        candidate=[replace_step(step(0), clip_norms=(2.0**-15, 2.0**-15))],
        holds=_at("clip"),
        refutes=(_at("reduction"), DRIFTED),
    ),
    "accumulation_dtype": Case(
        reference=[replace_step(step(0), accumulated_in="float32")],
        candidate=[replace_step(step(0, grad=0.25 + 2**-10), accumulated_in="bfloat16")],
        holds=_at("local"),
        refutes=(_at("update"), DRIFTED),
    ),
    "checkpoint_rng": Case(
        reference=[replace_step(step(0), checkpoint="replay")],
        candidate=[replace_step(step(0, grad=0.5), checkpoint="no_replay")],
        holds=_at("local"),
        refutes=(_at("reduction"), DRIFTED),
    ),
    "compile_changes_numerics": Case(
        reference=[step(0)],
        candidate=[replace_step(step(0, grad=0.5), compiled="2 modules, inductor")],
        holds=_at("local"),
        refutes=(_at("reduction"), DRIFTED),
    ),
    "reduced_in_lower_dtype": Case(
        reference=[_fine(step(0))],
        candidate=[_rounded(_fine(step(0)))],
        holds=_at("reduction"),
        refutes=(_at("local"), DRIFTED),
    ),
    "reduction_differs": Case(
        reference=[step(0)],
        candidate=[_grads(step(0), **{"layer.weight": torch.tensor([[0.25, 0.5], [0.25, 0.25]])})],
        holds=_at("reduction", source="straight"),
        refutes=(_at("local"), _at("update"), DRIFTED),
        kwargs={"localization": _EQUAL_EVERYWHERE},
    ),
    "reduce_order": Case(
        reference=[_grads(step(0, world=4), **{"layer.bias": torch.tensor([0.5, 0.00390625])})],
        candidate=[_grads(step(0, world=4), **{"layer.bias": _FEW_ULPS})],
        holds=HELD,
        refutes=(_at("loss"), _at("reduction", source="straight"), Measured(source="staged"), DRIFTED),
        profile=profiles.BF16,
        kwargs={"reduce_dtype": torch.bfloat16},
    ),
    "noise_gradient": Case(
        reference=[replace_step(step(0), grads=_NOISY)],
        candidate=[
            replace_step(
                step(0),
                grads={**_NOISY, "layer.bias": torch.full((2,), 3e-9)},
                params={"layer.weight": torch.full((2, 2), 1.0), "layer.bias": torch.full((2,), 3e-5)},
            )
        ],
        holds=HELD,
        refutes=(_at("update"), _at("update", source="straight"), DRIFTED),
        profile=profiles.FP32,
    ),
    "optimizer_only": Case(
        reference=[step(0)],
        candidate=[step(0, weight=next_float(1.0), state=next_float(0.125))],
        holds=_at("update"),
        refutes=(_at("reduction"), DRIFTED),
    ),
    "buffers_only": Case(
        reference=[step(0)],
        candidate=[
            replace_step(
                step(0), buffers=({"norm.running_mean": torch.zeros(2)}, {"norm.running_mean": torch.ones(2)})
            )
        ],
        holds=_at("buffer"),
        refutes=(_at("update"), DRIFTED),
    ),
    "tp_grad_not_reduced": Case(
        reference=[replace_step(step(0, world=4), grads={"norm.weight": torch.ones(2)})],
        candidate=[replace_step(step(0, world=4), grads={"norm.weight": torch.full((2,), 0.5)})],
        refutes=(_at("loss"), _at("update"), DRIFTED),
        kwargs={"config": _TP},
    ),
    "tp_partial_not_reduced": Case(
        reference=[step(0, world=4)],
        candidate=[replace_step(step(0, world=4), losses=(0.5, 0.75, 0.5, 0.5))],
        refutes=(_at("reduction"), DRIFTED),
        kwargs={"config": _TP, "localization": Localization(step=0, first=_module("layers.0.attention.o"))},
    ),
    # Self-contained: a fact of the records, checked by the pattern itself.
    "pp_microbatch_scaling": Case(
        reference=[step(0)],
        candidate=[step(0, grad=1.0)],  # 4x: the microbatch count
        kwargs={"config": _PP},
        without=([step(0)], [step(0, grad=0.75)]),
    ),
    "pp_tie_not_summed": Case(
        reference=[step(0)],
        candidate=[step(0, grad=0.5)],
        facts=_TIED,
        kwargs={"config": _PP},
        without=([step(0)], [_grads(step(0, grad=0.5), **{"layer.bias": torch.ones(2)})]),
    ),
    "pp_param_not_stepped": Case(
        reference=[step(0)],
        candidate=[replace_step(step(0, weight=2.0), optim_state={})],
        kwargs={"config": _PP},
        without=([step(0)], [step(0, weight=2.0)]),
    ),
    "pp_stage_inputs_differ": Case(
        reference=[step(0)],
        candidate=[replace_step(step(0), losses=(0.5, 0.75))],
        kwargs={"config": _PP},
        without=([step(0)], [step(0)]),
    ),
    "pp_zero_bubble_resharded": Case(
        reference=[step(0)],
        candidate=[step(0, grad=0.5)],
        kwargs={"config": _ZB},
        without=([step(0)], [step(0)]),
    ),
    "split_tie": Case(
        reference=[step(0)],
        candidate=[step(0, grad=0.5)],
        facts=FunctionFacts(split_ties=("lm_head.weight = embed.weight",)),
        without=([step(0)], [step(0)]),
    ),
    "skip_desync": Case(
        reference=[step(0)],
        candidate=[
            replace_step(step(0, weight=2.0), found_inf=((0.0,), (1.0,)), skipped=((False,), (True,)))
        ],
        without=([step(0)], [step(0, weight=2.0)]),
    ),
    "dtype_differs": Case(
        reference=[step(0)],
        candidate=[
            replace_step(step(0, weight=2.0), params={"layer.weight": torch.full((2, 2), 2.0).bfloat16()})
        ],
        without=([step(0)], [step(0, weight=2.0)]),
    ),
    "loss_dtype_differs": Case(
        reference=[replace_step(step(0), losses=(1.65625, 2.5))],
        candidate=[replace_step(step(0), losses=(1.655940055847168, 2.50071001052856))],
        without=(
            [replace_step(step(0), losses=(1.655940055847168, 2.5007))],
            [replace_step(step(0), losses=(1.6559401, 2.5007))],
        ),
    ),
    "autocast_differs": Case(
        reference=[step(0)],
        candidate=[step(0, weight=2.0)],
        kwargs={
            "localization": Localization(
                step=0, first=_module("inner.0.linear", dtypes=("float32", "float16"))
            )
        },
        # the output's dtype explained by a parameter held in another dtype: dtype_differs's
        without=([step(0)], [replace_step(step(0), params={"layer.weight": torch.ones(2, 2).half()})]),
    ),
    **{
        name: Case(
            reference=[step(0), step(1)],
            candidate=_resumed(audit),
            without=([step(0), step(1)], _resumed(_audit())),
        )
        for name, audit in {
            "resume_weights_not_restored": _audit({"weights": ["layer.weight"]}),
            "resume_weights_late": _audit(at_forward=False),
            "resume_shard_misplaced": _audit({"misplaced": ["layer.weight"]}),
            "resume_optimizer_not_restored": _audit({"optimizer": ["layer.weight:momentum_buffer"]}),
            "resume_step_counter_reset": _audit({"optimizer_step": ["layer.weight:step"]}),
            "resume_scaler_not_restored": _audit({"scaler": ["scale"]}),
            "resume_rng_not_restored": _audit({"rng": ["cpu"]}),
            "resume_scheduler_not_restored": _audit({"schedulers": ["0"]}),
        }.items()
    },
}


def _weighed(reference, candidate, case: Case, measured: Measured | None) -> causes.Weighed:
    ref, cand = run(*reference), run(*candidate, role="candidate")
    cand = dataclasses.replace(cand, facts=case.facts)
    comparison = compare_runs(ref, cand, profile=case.profile)
    return causes.weigh(ref, cand, comparison, measured=measured, **case.kwargs)


def test_every_cause_of_the_catalogue_has_a_premise_case():
    assert set(CASES) == {known.name for known in causes.CATALOGUE}


def test_every_cause_that_blames_a_stage_or_calls_it_rounding_is_refuted_by_some_measurement():
    """And every other cause is self-contained: a case without its fact."""
    for known in causes.CATALOGUE:
        case = CASES[known.name]
        if known.blames or known.rounding:
            assert case.refutes, known.name
        else:
            assert case.without is not None, known.name


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_cause_is_named_when_its_pattern_matches_and_its_premise_holds(name):
    case = CASES[name]
    found = _weighed(case.reference, case.candidate, case, case.holds)
    assert name in [c.name for c in found.named], (found.named, found.ruled_out)


_REFUTED = [(name, index) for name, case in sorted(CASES.items()) for index in range(len(case.refutes))]


@pytest.mark.parametrize(("name", "index"), _REFUTED)
def test_a_cause_whose_premise_the_evidence_refutes_is_ruled_out_not_named(name, index):
    case = CASES[name]
    measured = case.refutes[index]
    found = _weighed(case.reference, case.candidate, case, measured)
    assert name not in [c.name for c in found.named], measured
    (ruled,) = [r for r in found.ruled_out if r.name == name]
    assert ruled.why.startswith("needs ") or "mirror" in ruled.why, ruled.why


_SELF_CONTAINED = sorted(name for name, case in CASES.items() if case.without is not None)


@pytest.mark.parametrize("name", _SELF_CONTAINED)
def test_a_self_contained_cause_is_not_named_without_its_fact(name):
    case = CASES[name]
    reference, candidate = case.without  # type: ignore[misc]
    found = _weighed(reference, candidate, case, case.holds)
    assert name not in [c.name for c in found.named] + [r.name for r in found.ruled_out]


def test_a_rounding_cause_ruled_out_says_what_the_staged_check_found_first():
    case = CASES["reduce_order"]
    found = _weighed(case.reference, case.candidate, case, _at("loss"))
    (ruled,) = found.ruled_out
    assert ruled.describe() == (
        "ruled out (reduce_order): needs the staged check holding at every stage from a common state, "
        "with some reduced elements summed in another order than the mirror; the staged check found the "
        "loss stage differing first, at step 0 (the loss differs)"
    )


def test_summation_order_is_ruled_out_where_the_reduction_was_mirrored_bitwise():
    case = CASES["reduce_order"]
    found = _weighed(case.reference, case.candidate, case, Measured(source="staged", reordered=0))
    (ruled,) = found.ruled_out
    assert "every reduced element bitwise equal to the reference's mirror" in ruled.why


def test_a_tp_candidate_that_raised_on_a_shape_mismatch_is_named_plan_incomplete():
    cause = two_d.plan_incomplete(_TP, "[rank 0] RuntimeError: mat1 and mat2 shapes cannot be multiplied")
    assert cause is not None and cause.name == "tp_plan_incomplete"
    assert two_d.plan_incomplete(_TP, "[rank 0] RuntimeError: out of memory") is None
    assert two_d.plan_incomplete(_TP.with_(tp=None), "mat1 and mat2 shapes") is None


def test_a_row_the_staged_check_failed_is_explained_from_its_first_finding():
    """Straight through, step 0 drifted a float32 ulp (a last bit, as a reduction summed in another
    order leaves),
    so step 1 began from no common state; re-anchored, the staged check found step 1's loss
    differing from the same state: that, not the drift, is what the row measured."""
    from harness.parity.judge import result as results
    from harness.parity.judge.staged import Finding, Staged

    config = ParityConfig(engine="fsdp2", optimizer="adam_fused", layout=Layout(reshard_after_forward=True))
    reference = run(step(0), step(1))
    candidate = run(
        step(0, weight=next_float(1.0)), replace_step(step(1), losses=(0.5, 0.75)), role="candidate"
    )
    straight, _, _ = results.verdict(config, reference, candidate, gaps=[None], reused=False)
    assert "forward_differs" not in [c.name for c in straight.causes]  # drifted: nothing measured
    finding = Finding(step=1, stage="loss", what="loss", rank=1, detail="candidate 0.75, reference 0.5")
    judged = dataclasses.replace(straight, staged=Staged(passed=False, steps=2, findings=(finding,)))
    measured = results.measured_of(judged)
    assert (measured.source, measured.step, measured.stage) == ("staged", 1, "loss")
    explained = results.explained(judged, reference, candidate)
    assert "forward_differs" in [c.name for c in explained.causes]


def test_a_step_0_loss_difference_against_an_eager_twin_of_a_compiled_pipeline_is_compiles():
    """Against a twin compiled otherwise the forward's own numbers differ at step 0: the stages'
    data is not blamed for what compile did."""
    case = CASES["pp_stage_inputs_differ"]
    compiled = [replace_step(record, compiled="2 modules, inductor") for record in case.candidate]
    ref, cand = run(*case.reference), run(*compiled, role="candidate")
    found = causes.weigh(ref, cand, compare_runs(ref, cand, profile=case.profile), **case.kwargs)
    names = [c.name for c in found.named]
    assert names[0] == "compile_changes_numerics" and "pp_stage_inputs_differ" not in names, names
