"""The staged check decides rows whose straight comparison is not bitwise: a legitimate
reordering of the reduction passes, and a bug still fails, named by its stage.

Why these cases: at world size 4 a candidate whose reduce-scatter sums the ranks in another order
than its reference (``reordered_reduce``: what another backend or algorithm does) is a last bit
away from step 0, and an ``exact`` comparison calls it a FAIL. Re-anchored each step, its local
gradients match bitwise, every reduced element lies within the order-free bound, and the update
from the common state is bitwise: a pass. The bugs below reorder *and* break something, so only a
stage can tell them apart.

Then each rule for each kind of row it tells apart, alone and at world size 2 (the staged check
run directly, without the straight run): the local stage under FSDP1, FSDP2 and either kind of
accumulation; each scalar of the scaler's state the ranks record.
"""

from __future__ import annotations

import pytest

from fixtures.parity_plants import Plant, planted_executor
from harness.parity.doors import runner
from harness.parity.plan.config import Layout, Loop, ParityConfig
from harness.parity.report import markdown, render

_FSDP2 = {"engine": "fsdp2", "reshard_after_forward": True, "steps": 3, "world_size": 4}
_REORDERED = Plant(kind="reordered_reduce")


def _run(module_ranks, config: ParityConfig, plant: Plant):
    (outcome,) = runner.run([config], planted_executor(module_ranks, plant))
    return outcome.result


_REORDERED_ROWS = {
    "fp32-sgd": ParityConfig.from_flat(optimizer="sgd", **_FSDP2),
    "bf16-adam": ParityConfig.from_flat(optimizer="adam", **_FSDP2, precision="bf16"),
    "fp16-fused-adam": ParityConfig.from_flat(optimizer="adam_fused", **_FSDP2, precision="fp16"),
    "accumulated-sync-last": ParityConfig.from_flat(optimizer="sgd", **_FSDP2, accumulate=2, sync="last"),
    "accumulated-sync-every": ParityConfig.from_flat(optimizer="sgd", **_FSDP2, accumulate=2, sync="every"),
}


@pytest.fixture(scope="module")
def reordered(module_ranks):
    """``{case: ParityResult}`` of every row of :data:`_REORDERED_ROWS`, its reduction summed in
    another order. Why one run: the rows share one rank call and one staged call at world size 4
    (five runs of one row each cost five of each), and the report's test reads the same row."""
    outcomes = runner.run(list(_REORDERED_ROWS.values()), planted_executor(module_ranks, _REORDERED))
    return {case: outcome.result for case, outcome in zip(_REORDERED_ROWS, outcomes, strict=True)}


@pytest.mark.parametrize("case", list(_REORDERED_ROWS))
def test_a_reduction_summed_in_another_order_passes_the_staged_check(reordered, case):
    result = reordered[case]
    assert result.status == "pass", (result.reason, result.staged)
    assert result.max_ulp > 0, "the reordering moved no bit: the case tests nothing"
    assert result.closeness == "staged"
    assert result.staged is not None and result.staged.passed
    assert result.staged.reordered > 0
    assert result.staged.local_elements > 0 and result.staged.reduced_elements > 0
    assert result.staged.worst_ratio < 1


def test_a_bitwise_row_is_not_sent_to_the_staged_check(module_ranks):
    result = _run(module_ranks, ParityConfig.from_flat(optimizer="sgd", **_FSDP2), Plant(kind="none"))
    assert result.closeness == "bitwise" and result.staged is None


def test_the_report_says_which_rows_the_staged_check_decided_and_what_it_measured(reordered):
    result = reordered["fp32-sgd"]
    text = markdown.render_markdown([result], {"backend": "gloo", "world_size": 4})
    assert "## Decided by the staged check" in text
    assert f"- `{result.config.id}`: staged check passed over 3 steps" in text
    found = render.to_json([result], {})["configs"][0]["staged"]
    assert found["passed"] is True and found["reordered"] > 0 and found["findings"] == []
    assert render.to_json([result], {})["summary"]["closeness"] == {"staged": 1}


_FSDP1 = {"engine": "fsdp1", "use_orig_params": False, "steps": 4, "world_size": 4}


_UPDATE_ULP_ROWS = {
    name: ParityConfig.from_flat(optimizer="adam_fused", **engine)
    for name, engine in {
        "fsdp2": {**_FSDP2, "steps": 4},
        "fsdp1-full_shard": {**_FSDP1, "sharding": "full_shard"},
        "fsdp1-no_shard": {**_FSDP1, "sharding": "no_shard"},
        "fsdp1-hybrid_shard": {**_FSDP1, "sharding": "hybrid_shard", "use_orig_params": True},
    }.items()
}


@pytest.fixture(scope="module")
def update_ulp(module_ranks):
    """``{engine: ParityResult}`` of :data:`_UPDATE_ULP_ROWS`, each update a last bit off: one run
    (one rank call, one staged call and one localization call for the four rows)."""
    outcomes = runner.run(
        list(_UPDATE_ULP_ROWS.values()), planted_executor(module_ranks, Plant(kind="update_ulp"))
    )
    return {name: outcome.result for name, outcome in zip(_UPDATE_ULP_ROWS, outcomes, strict=True)}


@pytest.mark.parametrize("engine", list(_UPDATE_ULP_ROWS))
def test_a_last_bit_each_update_fails_the_update_stage_alone_because_the_reference_is_re_anchored(
    update_ulp, engine
):
    """Straight through, a last bit every update compounds into every later stage; re-anchored,
    each step starts from the candidate's state, so the next step's losses and local gradients
    (captured where each engine hands them to its reduction) stay bitwise, and only the update
    stage finds one step's ulp (held to equal bits, a fused optimizer's too)."""
    result = update_ulp[engine]
    assert result.status == "fail", (result.reason, result.staged)
    assert result.staged is not None and not result.staged.passed
    assert {f.stage for f in result.staged.findings} == {"update"}, result.staged.findings
    assert 0 < result.staged.update_max_ulp <= 2
    assert result.staged.local_elements > 0


def test_on_request_a_staged_row_shows_the_drift_a_reordering_alone_produces(module_ranks):
    config = ParityConfig.from_flat(optimizer="sgd", **_FSDP2)
    (outcome,) = runner.run([config], planted_executor(module_ranks, _REORDERED), drift=True)
    result = outcome.result
    drift = result.staged.reordering_drift
    assert len(drift) == config.steps and max(drift) > 0, drift  # another order moves bits at 4 ranks
    text = markdown.render_markdown([result], {"backend": "gloo", "world_size": 4})
    assert "the reference against itself summing in another order" in text


def test_on_a_gpu_both_sides_run_deterministic_kernels_and_the_switch_is_restored():
    import torch

    from harness.parity.ranks import staged

    with staged.deterministic(torch.device("cpu")):
        assert not torch.are_deterministic_algorithms_enabled()  # CPU kernels already are
    with staged.deterministic(torch.device("cuda", 0)):  # only the switch: no GPU is touched
        assert torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_running_statistic_that_moves_otherwise_fails_the_buffer_stage(module_ranks):
    config = ParityConfig.from_flat(workload="fixtures.edge_workload:edges", optimizer="sgd", **_FSDP2)
    result = _run(module_ranks, config, Plant(kind="buffer_ulp"))  # its buffer: a gain
    assert result.status == "fail", result.reason
    assert result.staged is not None and result.staged.findings[0].stage == "buffer", result.staged


def test_a_one_ulp_forward_change_under_fused_adam_fails_and_is_located(module_ranks):
    """A layer whose output moves by one ulp under FSDP2, with fused Adam (once held to the ``fp32``
    fallback, which such a change passed straight through): the row is ``exact`` now and fails at
    step 0, the staged check's local stage fails it too, and the row is located to that layer."""
    config = ParityConfig.from_flat(optimizer="adam_fused", **_FSDP2)
    result = _run(module_ranks, config, Plant(kind="output_ulp", module="inner.1.linear", amount=1))
    assert result.status == "fail", result.reason
    assert result.staged.findings[0].stage in ("loss", "local"), result.staged.findings
    assert result.profile == "exact" and result.reason.startswith("step 0"), result.reason
    assert result.localization is not None and result.localization.first is not None
    assert result.localization.first.module.startswith("inner.1"), result.localization.describe()


_ONE_ULP = Plant(kind="output_ulp", module="inner.1.linear", amount=1)
_LOCAL_KINDS = {
    "fsdp1": ParityConfig(
        engine="fsdp1", optimizer="sgd", steps=1, layout=Layout(sharding="full_shard", use_orig_params=False)
    ),
    "fsdp2": ParityConfig(
        engine="fsdp2", optimizer="sgd", steps=1, layout=Layout(reshard_after_forward=True)
    ),
    "accumulated-sync-last": ParityConfig(
        engine="fsdp2",
        optimizer="sgd",
        steps=1,
        layout=Layout(reshard_after_forward=True),
        loop=Loop(accumulate=2, sync="last"),
    ),
    "accumulated-sync-every": ParityConfig(
        engine="fsdp2",
        optimizer="sgd",
        steps=1,
        layout=Layout(reshard_after_forward=True),
        loop=Loop(accumulate=2, sync="every"),
    ),
}
"""One row of each kind whose local gradients the staged check captures its own way: FSDP1's flat
gradient split by its metadata, FSDP2's per parameter, an accumulation's unreduced sum once
(``sync="last"``) or each microbatch's (``sync="every"``), against the reference's hand
accumulation."""


@pytest.fixture(scope="module")
def one_ulp_staged(module_ranks):
    """``{kind: Staged}``: the staged check alone (one rank call at world size 2) of each row of
    :data:`_LOCAL_KINDS` whose candidate's ``inner.1.linear`` output is one ulp off."""
    from fixtures.parity_plants import staged_batch
    from harness.parity.judge import staged

    requests = [(config, False) for config in _LOCAL_KINDS.values()]
    per_rank = module_ranks.run(staged_batch, _ONE_ULP, requests, world_size=2)
    return {
        kind: staged.judge(config, [rank[index] for rank in per_rank])
        for index, (kind, config) in enumerate(_LOCAL_KINDS.items())
    }


@pytest.mark.parametrize("kind", list(_LOCAL_KINDS))
def test_local_gradients_that_differ_fail_the_local_stage_in_every_kind_of_row(one_ulp_staged, kind):
    """The local stage holds each kind of row to equal bits, not only the first stage that breaks:
    a one-ulp change in one layer's output moves the loss (its own stage) and every gradient below
    it, and the local stage must say so too. Loosened for one kind (its captured gradients
    compared with the reference's own, or not at all), that kind's compute mismatch would be left
    to the loss alone, which a change in backward only does not move."""
    found = one_ulp_staged[kind]
    assert not found.error, found.error
    assert "local" in {finding.stage for finding in found.findings}, found.findings
    assert found.local_elements > 0


def test_an_accumulation_that_reduces_every_microbatch_compares_each_microbatchs_local_gradients(
    one_ulp_staged,
):
    """With ``sync="every"`` each of the two microbatches is reduced, and each one's local
    gradients are compared: twice the elements of a row that reduces once per step."""
    every = one_ulp_staged["accumulated-sync-every"].local_elements
    assert every == 2 * one_ulp_staged["fsdp2"].local_elements
    assert one_ulp_staged["accumulated-sync-last"].local_elements == one_ulp_staged["fsdp2"].local_elements


def _staged_with_a_drifting_scaler(config: ParityConfig, field: str) -> dict:
    """On every rank: the staged check of ``config``, the candidate's scaler moving ``field``
    after each ``update()`` (``scaler_drift``)."""
    from fixtures.parity_plants import staged_batch

    (found,) = staged_batch(Plant(kind="scaler_drift", field=field), [(config, False)])
    return found


@pytest.mark.parametrize("field", ["scale", "tracker"])
def test_each_scalar_of_the_scalers_state_that_moved_otherwise_fails_the_scale_stage(module_ranks, field):
    """Each rank records the scale and the growth tracker of both sides after the step, and the
    scale stage compares each: a candidate whose scaler counts its growth interval otherwise under
    an equal scale (or scales otherwise under an equal count) fails naming that scalar."""
    from harness.parity.judge import staged

    config = ParityConfig(engine="fsdp2", optimizer="sgd", steps=1, layout=Layout(reshard_after_forward=True))
    found = staged.judge(
        config, module_ranks.run(_staged_with_a_drifting_scaler, config, field, world_size=2)
    )
    assert not found.error, found.error
    assert [(f.stage, f.what) for f in found.findings] == [("scale", field)], found.findings
