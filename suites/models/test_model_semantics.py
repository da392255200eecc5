"""The ground truth (``--ground-truth``) on the real-model tier: Llama, GPT-2, BERT and T5 train
like the whole batch; Mixtral's router load-balancing loss, a statistic of the batch each rank and
microbatch computes on its own, is named ``loss_couples_samples``, and without it Mixtral passes.
``make test`` measures two data-parallel ranks; ``make models`` also two microbatches and four ranks."""

import pytest

from suites.models.support import FULL, INSTALL_HINT

pytest.importorskip(
    "transformers", reason=f"the real-model tier needs Hugging Face transformers: {INSTALL_HINT}"
)

from harness.parity.judge import semantics  # noqa: E402
from harness.parity.plan.config import Layout, Loop, ParityConfig  # noqa: E402
from harness.parity.ranks.truth import stage  # noqa: E402

_SPLITS = [(2, 1), (2, 2), (4, 1)] if FULL else [(2, 1)]


def _verdict(workload: str, world_size: int, accumulate: int) -> semantics.Semantics:
    config = ParityConfig(
        engine="fsdp2",
        workload=workload,
        world_size=world_size,
        layout=Layout(reshard_after_forward=True),
        loop=Loop(accumulate=accumulate, sync="last" if accumulate > 1 else "every"),
    )
    return semantics.judge(config, stage.run_one(config))


@pytest.mark.parametrize(("world_size", "accumulate"), _SPLITS)
@pytest.mark.parametrize("model", ["llama", "gpt2", "bert", "t5"])
def test_a_hugging_face_model_trains_like_the_whole_batch(model, world_size, accumulate):
    verdict = _verdict(f"suites.models.workloads:{model}", world_size, accumulate)
    assert verdict.status == "pass", verdict.line()


@pytest.mark.parametrize(("world_size", "accumulate"), _SPLITS)
def test_mixtrals_load_balancing_loss_per_rank_is_named_a_loss_that_couples_its_samples(
    world_size, accumulate
):
    verdict = _verdict("suites.models.workloads:mixtral", world_size, accumulate)
    assert (verdict.status, verdict.step) == ("fail", 0), verdict.line()
    assert verdict.cause is not None and verdict.cause.name == "loss_couples_samples"


def test_mixtral_without_its_load_balancing_loss_trains_like_the_whole_batch():
    verdict = _verdict("suites.models.workloads:mixtral_without_router_loss", 2, 1)
    assert verdict.status == "pass", verdict.line()
