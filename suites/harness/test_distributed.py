"""Passing distributed tests: the marker and the fixture on gloo ranks, world sizes 2 and 4."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import harness


@harness.distributed(world_size=(2, 4), backend="gloo")
def test_all_reduce_sums_ranks(rank, world_size):
    """Each rank contributes its index; all_reduce gives the same sum on every rank."""
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    assert t.item() == sum(range(world_size))
    assert dist.get_world_size() == world_size


@harness.distributed(world_size=2)
@pytest.mark.parametrize("n", [1, 3])
def test_parametrize_reaches_ranks(n, tmp_path):
    """Parametrized and picklable fixture values (tmp_path) arrive in every rank."""
    ctx = harness.current()
    (tmp_path / f"rank{ctx.rank}").write_text(str(n))
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]
    assert ctx.device == torch.device("cpu")
    assert torch.get_num_threads() == 1


def _gather_rank(offset):
    ctx = harness.current()
    out = [None] * ctx.world_size
    dist.all_gather_object(out, ctx.rank + offset)
    return out


def test_ranks_fixture_returns_each_rank_result(ranks):
    """The fixture style: one return value per rank, ordered by rank."""
    assert ranks.run(_gather_rank, 10, world_size=2) == [[10, 11], [10, 11]]
    assert ranks.run(_gather_rank, 0, world_size=4) == [[0, 1, 2, 3]] * 4


_MODULE_RUNS = []


@pytest.fixture(scope="module")
def gathered_once(module_ranks):
    _MODULE_RUNS.append(1)
    return module_ranks.run(_gather_rank, 5, world_size=2)


@pytest.mark.parametrize("reader", ["first", "second"])
def test_module_ranks_runs_once_for_every_test_of_the_module(gathered_once, reader):
    """``module_ranks`` serves module-scoped fixtures: one rank run, read by many tests."""
    assert gathered_once == [[5, 6], [5, 6]]
    assert len(_MODULE_RUNS) == 1


@harness.distributed(world_size=2)
def test_nan_grad_injected_on_one_rank_only(rank):
    """corrupt_grad poisons rank 1's grad alone; a MAX all_reduce makes every rank see it."""
    model = torch.nn.Linear(4, 2)
    model(torch.ones(1, 4)).sum().backward()
    harness.rank.faults.corrupt_grad(1, model, value=float("nan"))
    local_bad = not all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert local_bad == (rank == 1)
    found = torch.tensor([float(local_bad)])
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    assert found.item() == 1.0


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i * i)])


@harness.distributed(world_size=2)
def test_dataloader_with_workers_inside_a_rank(rank):
    """Ranks are not daemonic, so a DataLoader may start worker processes inside one."""
    loader = torch.utils.data.DataLoader(_Squares(), batch_size=4, num_workers=2)
    total = torch.cat([batch for batch in loader]).sum()
    dist.all_reduce(total)
    assert total.item() == 2 * sum(i * i for i in range(8))


def _subtest_all_reduce(scale, size):
    t = torch.full((size,), float(scale))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((size,), 2.0 * scale))


@harness.distributed(world_size=2)
def test_subtests_all_pass():
    """run_subtests runs every configuration on one group and returns when all pass."""
    harness.run_subtests([{"scale": s, "size": n} for s in (1, 3) for n in (1, 5)], _subtest_all_reduce)


@harness.distributed(world_size=1)
def test_world_size_one_has_a_group(rank, world_size):
    assert (rank, world_size, dist.get_world_size()) == (0, 1, 1)


@harness.distributed(world_size=2, backend="nccl")
def test_nccl_all_reduce_on_own_device(rank):
    """NCCL ranks each own cuda:rank (skipped at collection on machines with too few GPUs)."""
    t = torch.ones(1, device=harness.current().device)
    assert t.device == torch.device("cuda", rank)
    dist.all_reduce(t)
    assert t.item() == 2.0


@harness.distributed(world_size=1, backend="nccl")
def test_nccl_single_gpu(rank):
    """The NCCL path on one GPU (skipped at collection without a GPU)."""
    t = torch.ones(1, device=harness.current().device)
    dist.all_reduce(t)
    assert t.item() == 1.0
