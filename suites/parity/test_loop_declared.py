"""A workload declares the loop it trains with (``Workload.clip``, ``accumulate``, ``sync``,
``checkpoint``): its matrix runs each under every engine layout; the caller's choice replaces it;
a declaration that cannot run is refused naming the fix."""

import pytest

from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.matrices.declared import Declared
from harness.parity.report import markdown
from harness.parity.workload.spec import WorkloadError
from suites.parity.support import cli_in_process

_DECLARED = "fixtures.loop_workloads:resmlp_loop"


def test_a_declared_max_norm_is_clipped_at_under_every_layout():
    rows = [c for c in workload_matrix.for_workload(_DECLARED) if c.loop.path == "unscale_clip"]
    assert {c.loop.clip for c in rows} == {0.5} and len(
        {
            (
                c.engine,
                c.layout.sharding,
                c.layout.use_orig_params,
                c.layout.reshard_after_forward,
                c.layout.offload,
            )
            for c in rows
        }
    ) == 12


def test_a_declared_accumulation_runs_its_microbatches_and_sync_mode_only():
    rows = [c for c in workload_matrix.for_workload(_DECLARED) if c.loop.accumulate > 1]
    assert {(c.loop.accumulate, c.loop.sync) for c in rows} == {(4, "last")}


def test_a_declared_checkpoint_runs_under_every_layout():
    rows = [c for c in workload_matrix.for_workload(_DECLARED) if c.loop.checkpoint]
    assert {c.loop.checkpoint for c in rows} == {"replay"} and any(c.layout.offload for c in rows)


def test_the_callers_loop_replaces_the_workloads_own():
    rows = [
        c
        for c in workload_matrix.for_workload(_DECLARED, declared=Declared(clip=2.0, accumulate=2))
        if c.loop.clip != 1.0 or c.loop.accumulate > 1
    ]
    assert {c.loop.clip for c in rows if c.loop.path == "unscale_clip"} == {2.0}
    assert {c.loop.accumulate for c in rows if c.loop.accumulate > 1} == {2}


def test_one_microbatch_declared_is_refused_naming_the_fix():
    with pytest.raises(WorkloadError, match="accumulate must be >= 2 microbatches"):
        workload_matrix.for_workload("fixtures.loop_workloads:resmlp_one_microbatch")


def test_the_cli_lists_the_declared_loop_in_words():
    done = cli_in_process("--workload", _DECLARED, "--list", "-k", "fsdp2")
    assert done.returncode == 0, done.stderr
    assert (
        "loop of resmlp_loop: clip_grad_norm_ at 0.5 after unscale_; 4 microbatches per step, syncing "
        "the last; units checkpointed (under every engine layout)"
    ) in done.stdout


def test_the_reports_header_says_the_declared_loop():
    text = markdown.render_markdown(
        [], {"backend": "gloo", "world_size": 2, "loops": {"resmlp_loop": "units checkpointed"}}
    )
    assert "`resmlp_loop` trains with units checkpointed." in text


def _layout(config):
    return (
        config.engine,
        config.layout.sharding,
        config.layout.use_orig_params,
        config.layout.reshard_after_forward,
        config.layout.offload,
    )


def test_a_declared_loop_of_several_features_also_runs_them_together_under_every_layout():
    together = [
        c
        for c in workload_matrix.for_workload(_DECLARED)
        if c.loop.path == "unscale_clip" and c.loop.accumulate > 1 and c.loop.checkpoint
    ]
    assert {(c.loop.clip, c.loop.accumulate, c.loop.sync, c.loop.checkpoint) for c in together} == {
        (0.5, 4, "last", "replay")
    }
    assert len({_layout(c) for c in together}) == 12


def test_a_single_loop_feature_gets_no_combined_rows():
    rows = workload_matrix.for_workload("fixtures.user_workloads:resmlp", declared=Declared(clip=0.5))
    assert not [
        c for c in rows if c.loop.path == "unscale_clip" and (c.loop.accumulate > 1 or c.loop.checkpoint)
    ]
