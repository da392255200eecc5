"""The ground truth through the runner and ``@parity_test`` on the warm pool: each row carries its
split's verdict, a split unlike the whole batch fails the outcome (the row's own status unchanged),
and a loss that takes ``num_items`` trains, on the ranks, the whole batch's gradient."""

import shlex
import subprocess
import sys

import pytest
import torch

from harness.parity import parity_test
from harness.parity.doors import runner
from harness.parity.plan.config import Layout, Loop, ParityConfig
from harness.parity.plan.matrices import workload as workload_matrix
from harness.parity.plan.select import select
from harness.parity.ranks.truth import gradients, pieces
from harness.parity.workload import registry
from suites.parity.support import ranks_executor

_PLANTS = "fixtures.semantic_workloads"
_ROWS = "fsdp2 and reshard and fp32 and sgd and not offload and not clip and suite=fsdp_vs_ddp"


def test_each_row_carries_its_splits_verdict_and_a_split_unlike_the_whole_batch_fails_the_outcome(
    module_ranks,
):
    configs = select(workload_matrix.for_workload(f"{_PLANTS}:tokens_mean_accumulated"), _ROWS)
    outcomes = runner.run(configs, ranks_executor(module_ranks), ground_truth=True)
    assert sorted(o.result.semantics.name for o in outcomes) == [
        "tokens_mean_acc-dp2",
        "tokens_mean_acc-dp2-acc2",
    ]
    for outcome in outcomes:
        assert outcome.result.status == "pass" and outcome.result.closeness == "bitwise"  # DDP shares the bug
        assert outcome.result.semantics.status == "fail" and not outcome.passed
        assert "known cause (loss_normalization)" in outcome.explanation


def test_without_the_ground_truth_a_row_carries_no_verdict_of_it(module_ranks):
    configs = select(workload_matrix.for_workload(f"{_PLANTS}:tokens_mean_accumulated"), _ROWS)[:1]
    (outcome,) = runner.run(configs, ranks_executor(module_ranks))
    assert outcome.result.semantics is None and outcome.passed


def test_a_loss_that_takes_num_items_trains_the_whole_batchs_gradient_on_the_ranks(module_ranks):
    config = ParityConfig(
        engine="fsdp2",
        workload=f"{_PLANTS}:tokens_count",
        layout=Layout(reshard_after_forward=True),
        loop=Loop(accumulate=2, sync="last"),
    )
    (outcome,) = runner.run([config], ranks_executor(module_ranks), keep_tensors=True)
    assert outcome.passed, outcome.explanation
    trained = outcome.reference.steps[0].grads  # the DDP twin's unscaled step-0 gradient, float32
    workload = registry.get(config.workload)
    model = gradients.float64_model(workload, config.seed)
    split = pieces.Split(ranks=2, microbatches=2, num_items=True)
    whole = pieces.whole_batch(pieces.step_pieces(workload, config.seed, split, 0)).batch
    truth = gradients.gradient(model, lambda: workload.loss_of(model, whole, workload.items(whole)))
    names = [name for name, _ in gradients.trainable(model)]
    got = torch.cat([trained[name].reshape(-1).double() for name in names])
    assert gradients.relative(got, truth) < 1e-5  # float32 against float64: the same gradient


@parity_test(f"{_PLANTS}:tokens_count_accumulated", k=_ROWS, ground_truth=True)
def test_parity_test_asks_for_the_ground_truth(parity):
    assert parity.passed, parity.explanation
    assert parity.result.semantics is not None and parity.result.semantics.status == "pass"


# -- the README's example, as written ------------------------------------------------------------------
_README = "README.md"


def _readme_folder(tmp_path):
    """A folder outside the checkout holding the README's ``my_tokens.py``, and its two commands."""
    from suites import doc_pages

    code = doc_pages.block_starting(_README, "# my_tokens.py").code
    (tmp_path / "my_tokens.py").write_text(code)
    commands = [
        command
        for block in doc_pages.blocks(doc_pages.ROOT / _README)
        if block.lang == "bash"
        for command in doc_pages.commands(block)
        if "--ground-truth" in command
    ]
    return tmp_path, commands


@pytest.mark.e2e
def test_the_readmes_ground_truth_example_fails_the_mean_and_passes_the_sum_as_a_user_runs_it(tmp_path):
    folder, commands = _readme_folder(tmp_path)
    assert [c.split()[4] for c in commands] == ["my_tokens:tokens_mean", "my_tokens:tokens_sum"]
    mean, total = (
        subprocess.run(
            [sys.executable, *shlex.split(c)[1:]], cwd=folder, capture_output=True, text=True, timeout=600
        )
        for c in commands
    )
    assert mean.returncode == 1, mean.stdout + mean.stderr
    assert "2 split(s) do not train like the whole batch" in mean.stdout, mean.stdout + mean.stderr
    assert "broke their tolerance" not in mean.stdout  # every row passes: DDP shares the bug
    assert total.returncode == 0, total.stdout + total.stderr
    assert "ground truth tokens_sum-dp2-acc2 (2 data-parallel ranks x 2 microbatches): pass" in total.stdout
