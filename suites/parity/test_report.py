"""The report's rendering is pinned with expecttest: a format change is a reviewed diff.

Regenerate after a deliberate change with ``EXPECTTEST_ACCEPT=1 pytest suites/parity/test_report.py``.
"""

import dataclasses
import json
import math

import expecttest

from fixtures.parity_records import replace_step, step
from harness.parity.judge.result import judge, skipped
from harness.parity.plan.config import Fault, Layout, Loop, ParityConfig, Precision, Scale
from harness.parity.ranks.wire import RankRow, RankRun, RankStep, StepTensors
from harness.parity.report import markdown, render

RUN = {"backend": "gloo", "world_size": 2, "scaler": "ours", "filter": "", "torch": "2.13.0+cpu"}


def _part(rank, reference_steps, candidate_steps, error=None):
    """What rank ``rank`` of ``entry.run_one`` sends for hand-made steps (tensors on rank 0)."""

    def rank_run(steps, error):
        sent = []
        for s in steps:
            tensors = (
                StepTensors(params=s.params, grads=s.grads, optim_state=s.optim_state) if rank == 0 else None
            )
            sent.append(
                RankStep(
                    loss=s.losses[rank],
                    scale=s.scales[rank],
                    tracker=s.trackers[rank],
                    found_inf=s.found_inf[rank],
                    skipped=s.skipped[rank],
                    tensors=tensors,
                )
            )
        return RankRun(rank=rank, steps=tuple(sent), counters={}, error=error, duration_s=0.25)

    return RankRow(
        id="row",
        reference=rank_run(reference_steps, None),
        reference_description="DDP",
        reference_reused=False,
        candidate=rank_run(candidate_steps, error),
        candidate_description="candidate",
    )


def _results():
    ok = ParityConfig(engine="fsdp1", layout=Layout(sharding="full_shard", use_orig_params=False))
    diverged = ParityConfig(
        engine="fsdp2",
        optimizer="adam",
        layout=Layout(reshard_after_forward=True),
        precision=Precision(dtype="bf16"),
    )
    crashed = ParityConfig(
        suite="forced_inf",
        engine="fsdp2",
        optimizer="adam_fused",
        faults=(Fault(step=1, rank=1),),
        layout=Layout(reshard_after_forward=True),
        loop=Loop(path="unscale_clip"),
        scale=Scale(scaler="torch"),
    )
    hybrid = ParityConfig(engine="fsdp1", layout=Layout(sharding="hybrid_shard", use_orig_params=True))
    steps = [step(0), step(1, skipped=True, scale=2.0, tracker=0)]
    drift = [
        step(0),
        replace_step(step(1, skipped=True, scale=2.0, tracker=0, weight=1.5), losses=(0.5, 0.625)),
    ]
    error = "[rank 0] Traceback\n[rank 0] RuntimeError: output with shape [] doesn't match the broadcast shape [1]"
    return [
        judge(ok, [_part(r, steps, steps) for r in range(2)])[0],
        judge(diverged, [_part(r, steps, drift) for r in range(2)])[0],
        judge(crashed, [_part(r, steps, steps[:1], error) for r in range(2)])[0],
        skipped(hybrid, "HYBRID_SHARD needs an even world size >= 4"),
    ]


def _ascii(text):
    """expecttest pins printable ASCII only: the report's ``≤`` is pinned as ``<=``."""
    return text.replace("≤", "<=")


class TestRendering(expecttest.TestCase):
    def test_markdown_has_one_row_per_configuration_then_divergences_and_skip_reasons(self):
        self.assertExpectedInline(
            _ascii(markdown.render_markdown(_results(), RUN)),
            """\
# Parity report

gloo, world size 2, scaler ours, torch 2.13.0+cpu

1 pass, 1 fail, 1 crash, 1 skip of 4 (expected failures: 1)

Measured (passing configurations): 1 bitwise. `bitwise`: every value equal; `<= N ulp`: at most N units in the last place apart; `staged`: not bitwise straight through, and every step held from a common state (local gradients bitwise, each reduced element within the order-free bound, the update bitwise); `toleranced`: farther apart, within the profile's rtol/atol.

Profiles: `exact` bitwise; `fp32` rtol 1.3e-06, atol 1e-05; `bf16` rtol 0.016, atol 0.001; `fp16` rtol 0.001, atol 0.001. Every profile but `exact` is a fallback tolerance (clipping under FSDP; NCCL): a pass under it says how close, not that sharding changed nothing.

Recipes (how the precision is applied; each row's is in its `recipe` column): `fp32` 3, `pure-bf16` 1.

## FSDP vs DDP

| configuration | engine | sharding | recipe | optimizer | offload | status | measured | profile | max loss diff | first diverging step | worst tensor | skipped steps | time |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| `fsdp1-full_shard-flat-fp32-sgd-w2` | fsdp1 | full_shard flat | fp32 | sgd | - | pass | bitwise | exact | 0 | - | - | 1 | 0.50s |
| `fsdp2-reshard-bf16-adam-w2` | fsdp2 | reshard | pure-bf16 | adam | - | FAIL | - | exact | 0.12 | 1 | param layer.weight @1: abs 0.5, rel 0.5, 4.2e+06 ulp | 1 | 0.50s |
| `fsdp1-hybrid_shard-orig-fp32-sgd-w2` | fsdp1 | hybrid_shard orig | fp32 | sgd | - | skip | - | exact | - | - | - | - | - |

## Forced-inf step skipping

| configuration | engine | sharding | recipe | optimizer | offload | status | measured | profile | max loss diff | first diverging step | worst tensor | skipped steps | time |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| `fsdp2-reshard-fp32-adam_fused-unscale_clip-inf@r1s1-torch_scaler-w2` | fsdp2 | reshard | fp32 | adam_fused (unscale_clip) | - | xfail | - | fp32 | 0 | 1 | - | - | 0.50s |

## Divergences

- `fsdp2-reshard-bf16-adam-w2` FAIL:
  - step 1, rank 1 loss 0.625, reference 0.5 (abs diff 0.125) (profile exact)
    - known cause (forward_differs): the loss differs at step 1 on rank(s) 1, from the same parameters and state (the straight runs were bitwise at every earlier step). The forward pass itself differs: how the model is wrapped, the input dtype or its casting, or a module that behaves differently when sharded; the first diverging module says where (torchtitan#734)
  - step 1, param layer.weight: 4 / 4 mismatched; max abs 0.5, max rel 0.5, 4.2e+06 ulp (profile exact)
- `fsdp2-reshard-fp32-adam_fused-unscale_clip-inf@r1s1-torch_scaler-w2` xfail (expected: torch's scaler crashes: unscale_ then a fused step on DTensor grads (found_inf shape [1] vs [])):
  - step 1, the candidate raised: [rank 0] RuntimeError: output with shape [] doesn't match the broadcast shape [1]

  ```
  [rank 0] Traceback
  [rank 0] RuntimeError: output with shape [] doesn't match the broadcast shape [1]
  [rank 0] Traceback
  [rank 0] RuntimeError: output with shape [] doesn't match the broadcast shape [1]
  ```

## Not run here

- 1 configuration(s): HYBRID_SHARD needs an even world size >= 4
""",
        )

    def test_the_terminal_summary_counts_by_suite_and_names_what_broke(self):
        self.assertExpectedInline(
            markdown.render_summary(_results()),
            """\
suite        total  pass  fail crash error  skip xfail
------------------------------------------------------
fsdp_vs_ddp      3     1     1     0     0     1     0
forced_inf       1     0     0     1     0     0     1
FAIL fsdp2-reshard-bf16-adam-w2: step 1, rank 1 loss 0.625, reference 0.5 (abs diff 0.125) (profile exact)
xfail fsdp2-reshard-fp32-adam_fused-unscale_clip-inf@r1s1-torch_scaler-w2 [expected]: step 1, the candidate raised: [rank 0] RuntimeError: output with shape [] doesn't match the broadcast shape [1]""",
        )


def test_the_json_report_is_strict_json_with_a_versioned_schema():
    results = _results()
    text = json.dumps(render.to_json(results, RUN), allow_nan=False)
    data = json.loads(text)
    assert (data["schema"], data["version"]) == ("shardscale.parity", 2)
    assert data["summary"] == {
        "total": 4,
        "pass": 1,
        "fail": 1,
        "crash": 1,
        "error": 0,
        "skip": 1,
        "expected_failures": 1,
        "closeness": {"bitwise": 1},
    }
    assert [c["status"] for c in data["configs"]] == ["pass", "fail", "crash", "skip"]
    assert data["configs"][2]["config"]["faults"] == ["inf@r1s1"]
    assert data["configs"][1]["curves"]["candidate"]["loss"] == [[0.5, 0.5], [0.5, 0.625]]
    assert data["profiles"]["fp16"] == {"rtol": 1e-3, "atol": 1e-3}


def test_non_finite_numbers_are_written_as_strings():
    assert render._numbers([1.0, math.inf, -math.inf, [math.nan]]) == [1.0, "inf", "-inf", ["nan"]]


def test_the_figure_is_written_when_something_ran(tmp_path):
    from harness.parity.report.plot import render_png

    assert render_png(_results(), tmp_path / "parity.png")
    assert (tmp_path / "parity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not render_png(_results()[3:], tmp_path / "none.png")


def test_a_broken_rows_panel_names_its_known_causes():
    from harness.parity.judge.evidence import Cause
    from harness.parity.report.plot import panel_title

    def cause(name):
        return Cause(name=name, evidence="e", explanation="x", reference="r")

    diverged = dataclasses.replace(_results()[1], causes=(cause("reduce_order"), cause("optimizer_only")))
    assert panel_title(diverged) == f"{diverged.config.id}\nknown cause: reduce_order, optimizer_only"
    assert panel_title(_results()[0]) == _results()[0].config.id


def test_an_expected_failures_panel_says_it_is_expected():
    from harness.parity.report.plot import panel_title

    known = dataclasses.replace(_results()[1], expected_failure="torch's known defect", causes=())
    assert panel_title(known) == f"{known.config.id} (expected)"


def test_the_markdown_report_says_which_fsdp_units_each_workload_got():
    run = {**RUN, "units": {"hf_llama": "LlamaDecoderLayer (auto, from LlamaForCausalLM._no_split_modules)"}}
    text = markdown.render_markdown(_results(), run)
    assert "FSDP units: `hf_llama` LlamaDecoderLayer (auto, from LlamaForCausalLM._no_split_modules)." in text


def test_a_large_matrixs_heatmap_names_only_the_rows_it_shows_something_of():
    """Past 60 rows the heatmap names the broken rows and those not bitwise at some step (the rest
    are white); a small matrix's names every row."""
    from types import SimpleNamespace

    from harness.parity.report.plot import labelled_rows

    def row(ulp, broken=False):
        return SimpleNamespace(
            broken=broken, distances=[SimpleNamespace(max_ulp=0.0), SimpleNamespace(max_ulp=ulp)]
        )

    large = [row(0.0)] * 61 + [row(3.0), row(0.0, broken=True), row(math.inf)]
    assert labelled_rows(large) == [61, 62, 63]
    assert labelled_rows(large[:60]) == list(range(60))


def test_suite_labels_that_clear_each_other_stay_on_their_bands():
    from harness.parity.report.spread import spread

    assert spread([10.0, 50.0, 90.0], [20.0, 20.0, 20.0], -0.5, 100.0) == [10.0, 50.0, 90.0]


def test_short_neighbouring_suites_labels_are_moved_apart_inside_the_axis():
    """The sparse suite's 3 rows beside cpu_offload's at the bottom edge: their names overlapped."""
    from harness.parity.report.spread import spread

    extents = [30.0, 10.0, 12.0]
    placed = spread([80.0, 198.0, 206.5], extents, -0.5, 212.5)
    assert placed[0] == 80.0
    assert placed[2] + extents[2] / 2 <= 212.5
    assert placed[2] - placed[1] >= (extents[1] + extents[2]) / 2
    assert placed[1] - placed[0] >= (extents[0] + extents[1]) / 2
