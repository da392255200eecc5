"""The scaler's examples in the documentation run as written, on 2 gloo ranks.

Why a test: an example that no longer runs teaches the wrong thing. Every python block of the
pages that starts with ``from scaler import`` is read out of its page and executed on each rank
of the warm pool, in a namespace holding what the page leaves to the reader (a model, data, an
optimizer, a path). The training loop runs with an inf in rank 1's data at one step, so what the
page claims is what is checked: every rank skips that step and holds the same scale.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

import harness
from suites import doc_pages

EXAMPLES = [block for block in doc_pages.all_blocks("python") if block.code.startswith("from scaler import")]

POISONED_STEP = 2
"""The step at which rank 1's inputs hold an inf (fp16 autocast: its gradients overflow)."""


def _loop_namespace(rank: int) -> dict:
    torch.manual_seed(0)  # the same model on every rank
    model = nn.Linear(8, 4)
    generator = torch.Generator().manual_seed(rank)  # each rank's own data
    data = [
        (torch.randn(16, 8, generator=generator), torch.randn(16, 4, generator=generator)) for _ in range(4)
    ]
    if rank == 1:
        data[POISONED_STEP][0][0, 0] = float("inf")
    return {
        "torch": torch,
        "model": model,
        "data": data,
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        "loss_fn": nn.functional.mse_loss,
        "device_type": "cpu",
    }


def _optimizer_namespace(rank: int, path: str) -> dict:
    from scaler import ShardedGradScaler

    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    scaler = ShardedGradScaler("cpu")
    scaler.scale(model(torch.randn(2, 8)).sum()).backward()  # the gradients the page's step takes
    return {"torch": torch, "model": model, "scaler": scaler, "path": path}


def _on_rank_run(code: str, where: str, folder: str) -> dict:
    rank = harness.current().rank
    if "ShardedOptimizer(" in code:
        namespace = _optimizer_namespace(rank, f"{folder}/optim-rank{rank}.pt")
        exec(compile(code, where, "exec"), namespace)
        saved = torch.load(namespace["path"])
        return {"state": sorted(saved["state"]), "params": saved["param_groups"][0]["params"]}
    if "for inputs, target in data:" in code:
        namespace = _loop_namespace(rank)
        exec(compile(code, where, "exec"), namespace)
        scaler = namespace["scaler"]
        scales = [None] * dist.get_world_size()
        dist.all_gather_object(scales, scaler.get_scale())
        return {"scales": scales, "skipped": int(scaler.skipped_steps), "steps": int(scaler.steps)}
    raise AssertionError(f"{where}: a scaler example this test has no namespace for; add one")


@pytest.mark.parametrize("block", EXAMPLES, ids=[block.where for block in EXAMPLES])
def test_the_scaler_example_runs_as_written_on_two_ranks(block, ranks, tmp_path):
    results = ranks.run(_on_rank_run, block.code, block.where, str(tmp_path), world_size=2)
    if "scales" in results[0]:
        assert results[0]["scales"] == results[1]["scales"] == [results[0]["scales"][0]] * 2
        assert [r["skipped"] for r in results] == [1, 1], "every rank skips the step rank 1 overflowed"
        assert [r["steps"] for r in results] == [4, 4]
    else:
        assert results == [{"state": ["bias", "weight"], "params": ["weight", "bias"]}] * 2


def test_the_pages_hold_the_scaler_examples():
    where = {(str(block.page), block.code.splitlines()[0]) for block in EXAMPLES}
    assert ("docs/scaler.md", "from scaler import GradScaler, ShardedGradScaler") in where
    assert ("docs/scaler.md", "from scaler import ShardedGradScaler, ShardedOptimizer") in where
