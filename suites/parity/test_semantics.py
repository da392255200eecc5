"""The ground-truth stage (``ranks/truth/``, ``judge/semantics.py``): each step's gradient as the
setup splits the global batch against the whole batch's, in float64 on one process. Each plant of
``fixtures/semantic_workloads.py`` fails at the step it starts, named; each correct variant passes.
In-process: the stage runs no collective."""

import pytest
import torch
from torch import nn

from harness.parity.judge import semantics
from harness.parity.plan.config import Layout, Loop, ParityConfig
from harness.parity.ranks.truth import gradients, lockstep, stage
from harness.parity.workload.spec import Workload, WorkloadError

_PLANTS = "fixtures.semantic_workloads"


def _config(workload: str, world_size: int = 2, accumulate: int = 1) -> ParityConfig:
    return ParityConfig(
        engine="fsdp2",
        workload=workload,
        world_size=world_size,
        layout=Layout(reshard_after_forward=True),
        loop=Loop(accumulate=accumulate, sync="last" if accumulate > 1 else "every"),
    )


def _verdict(workload: str, world_size: int = 2, accumulate: int = 1) -> semantics.Semantics:
    config = _config(workload, world_size, accumulate)
    return semantics.judge(config, stage.run_one(config))


def _named(verdict: semantics.Semantics) -> str | None:
    return verdict.cause.name if verdict.cause is not None else None


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_per_rank_mean_over_uneven_token_counts_fails_at_step_0_as_loss_normalization(world_size):
    verdict = _verdict(f"{_PLANTS}:tokens_mean", world_size)
    assert (verdict.status, verdict.step, _named(verdict)) == ("fail", 0, "loss_normalization")
    assert verdict.distance > 1e-3, verdict.line()


def test_a_per_microbatch_mean_under_accumulation_fails_at_step_0_as_loss_normalization():
    verdict = _verdict(f"{_PLANTS}:tokens_mean_accumulated", accumulate=2)
    assert (verdict.status, verdict.step, _named(verdict)) == ("fail", 0, "loss_normalization")
    assert "rank 1 microbatch 1" in verdict.cause.evidence  # every piece's weight is shown


@pytest.mark.parametrize(("world_size", "accumulate"), [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_the_sum_over_items_divided_by_the_whole_batchs_count_passes(world_size, accumulate):
    verdict = _verdict(f"{_PLANTS}:tokens_count", world_size, accumulate)
    assert verdict.status == "pass", verdict.line()
    assert verdict.distance <= gradients.BOUND and verdict.steps == _config("mlp").steps  # every step


def test_a_per_microbatch_mean_over_equal_counts_passes():
    assert _verdict(f"{_PLANTS}:tokens_equal", accumulate=2).status == "pass"


def test_a_sampler_that_repeats_a_sample_to_even_out_the_ranks_is_named_sampler_padding():
    verdict = _verdict(f"{_PLANTS}:sampler_padded")
    assert (verdict.status, verdict.step, _named(verdict)) == ("fail", 0, "sampler_padding")
    assert "served twice" in verdict.cause.evidence


def test_a_sampler_that_drops_the_last_samples_passes():
    assert _verdict(f"{_PLANTS}:sampler_dropped").status == "pass"


def test_batchnorm_over_each_ranks_share_is_named_batchnorm_per_rank_with_syncbatchnorm_as_the_way_out():
    verdict = _verdict(f"{_PLANTS}:batchnorm_local")
    assert (verdict.status, verdict.step, _named(verdict)) == ("fail", 0, "batchnorm_per_rank")
    assert "SyncBatchNorm" in verdict.cause.explanation and verdict.module == "1 (BatchNorm1d)"


@pytest.mark.parametrize("world_size", [2, 4])
def test_syncbatchnorm_over_every_ranks_share_passes(world_size):
    assert _verdict(f"{_PLANTS}:syncbatchnorm", world_size).status == "pass"


def test_syncbatchnorm_under_accumulation_is_named_for_its_statistics_per_microbatch():
    verdict = _verdict(f"{_PLANTS}:syncbatchnorm_accumulated", accumulate=2)
    assert (verdict.status, verdict.step, _named(verdict)) == ("fail", 0, "batchnorm_per_rank")
    assert "each of the 2 microbatches by its own statistics" in verdict.cause.evidence


def test_the_stages_syncbatchnorm_normalizes_one_input_as_torchs_batch_norm_does():
    torch.manual_seed(0)
    synced, plain = nn.SyncBatchNorm(3).double(), nn.BatchNorm1d(3).double()
    lockstep.install(synced)
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    assert gradients.relative(synced(x), plain(x)) < 1e-14
    assert gradients.relative(synced.running_var, plain.running_var) < 1e-14


def test_a_per_sample_norm_passes():
    assert _verdict(f"{_PLANTS}:layernorm").status == "pass"


def test_a_loss_divided_by_the_world_size_on_top_of_the_average_is_named_microbatch_scaling():
    verdict = _verdict(f"{_PLANTS}:tokens_over_world")
    assert (verdict.status, verdict.step, _named(verdict)) == ("fail", 0, "microbatch_scaling")
    assert "0.5 times" in verdict.cause.evidence and "world size" in verdict.cause.evidence


@pytest.mark.parametrize("workload", ["mlp", "transformer", "frozen", "llama", "convnet", "uneven", "canary"])
def test_the_built_in_workloads_train_like_the_whole_batch(workload):
    verdict = _verdict(workload)
    assert verdict.status == "pass", verdict.line()
    assert verdict.rounding <= gradients.BOUND * gradients.ROUNDING_ROOM


def test_a_workload_whose_data_depends_on_the_loss_scale_is_skipped_with_why():
    config = ParityConfig(engine="ddp", reference="single", workload="embedding")
    verdict = semantics.judge(config, stage.run_one(config))
    assert verdict.status == "skip" and "loss scale" in verdict.reason


def test_a_forward_that_draws_random_numbers_outside_dropout_modules_is_skipped_with_why():
    verdict = _verdict(f"{_PLANTS}:functional_dropout")
    assert verdict.status == "skip" and "random numbers" in verdict.reason


def test_splits_of_one_workload_size_and_microbatch_count_share_one_measurement():
    sgd, adam = _config("mlp"), _config("mlp").with_(optimizer="adam_fused")
    assert semantics.key(sgd) == semantics.key(adam)
    assert semantics.key(sgd) != semantics.key(_config("mlp", accumulate=2))
    assert semantics.name(_config("mlp", 4, 2)) == "mlp-dp4-acc2"


def test_a_loss_that_takes_num_items_needs_items_to_count_them():
    with pytest.raises(WorkloadError, match="declare items="):
        Workload(name="bad", model=object, batch=lambda r, s: None, loss=lambda model, batch, num_items: 0)


def test_the_readmes_mean_per_microbatch_is_named_and_its_sum_over_all_tokens_passes(tmp_path, monkeypatch):
    from suites import doc_pages

    (tmp_path / "my_tokens_readme.py").write_text(
        doc_pages.block_starting("README.md", "# my_tokens.py").code
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mean = _verdict("my_tokens_readme:tokens_mean", accumulate=2)
    assert (mean.status, mean.step, _named(mean)) == ("fail", 0, "loss_normalization")
    assert _verdict("my_tokens_readme:tokens_sum", accumulate=2).status == "pass"
