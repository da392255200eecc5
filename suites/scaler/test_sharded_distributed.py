"""ShardedGradScaler on 2 gloo ranks: every rank makes the same skip decision and holds the same scale.

Each test runs the ``_on_rank_*`` functions below on the harness's warm ranks (the ``ranks``
fixture) and compares what the ranks returned. Only rank 1 overflows in the forced-inf tests, so
agreement is what is being tested.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

import harness
from fixtures.training import batch, make_model, make_optimizer
from scaler import ShardedGradScaler

PATHS = ["plain", "unscale_first", "adam_fused", "adamw_fused", "sgd_fused"]


class AllReduceCounter:
    """Counts ``torch.distributed.all_reduce`` calls while active (the scaler's only collective)."""

    def __init__(self) -> None:
        self.calls = 0
        self._real = dist.all_reduce

    def __enter__(self) -> "AllReduceCounter":
        def counting(*args, **kwargs):
            self.calls += 1
            return self._real(*args, **kwargs)

        dist.all_reduce = counting
        return self

    def __exit__(self, *exc) -> None:
        dist.all_reduce = self._real


def _on_rank_train_with_overflow_on_rank_1(path, implementation, overflowing_ranks=(1,)):
    """Three steps on identical data; step 1 has an inf grad on rank 1 only (or on the given ranks)."""
    rank = harness.current().rank
    model = make_model(0)
    kind = "sgd" if path in ("plain", "unscale_first") else path
    opt = make_optimizer(model, kind)
    cls = ShardedGradScaler if implementation == "ours" else TorchShardedGradScaler
    scaler = cls("cpu", init_scale=1024.0, growth_interval=2)
    record = {"skipped": [], "scales": [], "trackers": [], "all_reduces": []}
    for step in range(3):
        opt.zero_grad()
        scaler.scale(model(batch(step)).pow(2).mean()).backward()
        if step == 1 and rank in overflowing_ranks:
            model[0].weight.grad[0, 0] = float("inf")
        before = [p.detach().clone() for p in model.parameters()]
        with AllReduceCounter() as counter:
            if path == "unscale_first":
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
        scaler.update()
        record["all_reduces"].append(counter.calls)
        record["skipped"].append(
            all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
        )
        record["scales"].append(scaler.get_scale())
        record["trackers"].append(scaler._get_growth_tracker())
    record["params"] = torch.cat([p.detach().flatten() for p in model.parameters()])
    return record


@pytest.mark.parametrize("path", PATHS)
def test_an_inf_on_one_rank_makes_every_rank_skip(ranks, path):
    records = ranks.run(_on_rank_train_with_overflow_on_rank_1, path, "ours", world_size=2)
    for rank, record in enumerate(records):
        assert record["skipped"] == [False, True, False], f"rank {rank}"
        assert record["scales"] == [1024.0, 512.0, 512.0], f"rank {rank}"
        assert record["trackers"] == [1, 0, 1], f"rank {rank}"
    assert torch.equal(records[0]["params"], records[1]["params"])


@pytest.mark.parametrize("path", PATHS)
def test_one_all_reduce_per_optimizer_step(ranks, path):
    records = ranks.run(_on_rank_train_with_overflow_on_rank_1, path, "ours", world_size=2)
    assert [record["all_reduces"] for record in records] == [[1, 1, 1], [1, 1, 1]]


@pytest.mark.parametrize("path", ["adam_fused", "adamw_fused", "sgd_fused"])
def test_an_inf_on_every_rank_skips_the_fused_step_on_every_rank(ranks, path):
    """The agreed flag must be exactly 1.0 however many ranks overflow: fused kernels skip only on
    1.0, so a flag of 2.0 (a SUM where a MAX belongs) would let them step on inf grads."""
    records = ranks.run(_on_rank_train_with_overflow_on_rank_1, path, "ours", (0, 1), world_size=2)
    for rank, record in enumerate(records):
        assert record["skipped"] == [False, True, False], f"rank {rank}"
        assert record["scales"] == [1024.0, 512.0, 512.0], f"rank {rank}"
        assert torch.isfinite(record["params"]).all(), f"rank {rank}"


def test_torchs_scaler_diverges_with_a_fused_optimizer_where_ours_agrees(ranks):
    theirs = ranks.run(_on_rank_train_with_overflow_on_rank_1, "adam_fused", "torch", world_size=2)
    # torch: rank 0 never hears about rank 1's inf, steps and keeps its scale; rank 1 skips and backs off.
    assert theirs[0]["skipped"] == [False, False, False]
    assert theirs[1]["skipped"] == [False, True, False]
    assert theirs[0]["scales"][1] != theirs[1]["scales"][1]
    assert not torch.equal(theirs[0]["params"], theirs[1]["params"])
    ours = ranks.run(_on_rank_train_with_overflow_on_rank_1, "adam_fused", "ours", world_size=2)
    assert ours[0]["skipped"] == ours[1]["skipped"] == [False, True, False]
    assert torch.equal(ours[0]["params"], ours[1]["params"])


def _on_rank_default_group_after_the_group_is_re_created():
    """The default group is destroyed and re-created after torch's module was imported (a warm rank
    pool does this between tests; so does an elastic restart). Then each scaler is built with no
    ``process_group`` and asked which group it would reduce over."""
    import torch.distributed.fsdp.sharded_grad_scaler  # noqa: F401 - imported while a group lives

    harness.current().reset_group("re-created")
    theirs = TorchShardedGradScaler("cpu")
    ours = ShardedGradScaler("cpu")
    return {
        "torch_reduces_over_the_current_group": theirs.process_group is dist.group.WORLD,
        "ours_reduces_over_the_current_group": ours.process_group is dist.group.WORLD,
    }


def test_torchs_default_group_is_frozen_at_import_where_ours_is_looked_up_when_used(ranks):
    """torch's ``process_group=dist.group.WORLD`` default is evaluated when its module is imported:
    after the group is re-created it reduces over a destroyed one (a hang, seen in this project's
    parity matrix before its engine passed the group explicitly)."""
    for record in ranks.run(_on_rank_default_group_after_the_group_is_re_created, world_size=2):
        assert record == {
            "torch_reduces_over_the_current_group": False,
            "ours_reduces_over_the_current_group": True,
        }


def _on_rank_fsdp2_step(overflow_on_rank_1):
    """FSDP2 (DTensor grads) plus one plain parameter, against an unsharded replica with averaged grads."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world_size = harness.current().rank, harness.current().world_size
    mesh = init_device_mesh("cpu", (world_size,))
    reference = make_model(0)
    model = copy.deepcopy(reference)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    extra = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([*model.parameters(), extra], lr=0.1)
    scaler = ShardedGradScaler("cpu", init_scale=256.0)
    data = batch(0, rank=rank)
    scaler.scale(model(data).pow(2).mean() + extra.sum()).backward()
    if overflow_on_rank_1 and rank == 1:
        next(model.parameters()).grad.to_local().view(-1)[0] = float("inf")
    with AllReduceCounter() as counter:
        scaler.unscale_(opt)
    sharded_grads = [p.grad.full_tensor() for p in model.parameters()]
    before = [p.detach().full_tensor() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    after = [p.detach().full_tensor() for p in model.parameters()]
    reference(data).pow(2).mean().backward()
    for p in reference.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world_size
    return {
        "grad_types": sorted({type(p.grad).__name__ for p in model.parameters()}),
        "extra_grad": extra.grad.tolist(),
        "max_grad_diff": max(
            (g - r.grad).abs().max().item()
            for g, r in zip(sharded_grads, reference.parameters(), strict=True)
        ),
        "skipped": all(torch.equal(b, a) for b, a in zip(before, after, strict=True)),
        "scale": scaler.get_scale(),
        "all_reduces": counter.calls,
    }


needs_fsdp2_on_cpu = pytest.mark.skipif(
    not hasattr(torch.cpu.Stream, "record_event"),
    reason=f"torch {torch.__version__}: FSDP2 cannot run on the CPU (torch.cpu.Stream has no record_event)",
)


@needs_fsdp2_on_cpu
def test_fsdp2_dtensor_grads_are_unscaled_through_their_local_shards(ranks):
    records = ranks.run(_on_rank_fsdp2_step, False, world_size=2)
    for record in records:
        assert record["grad_types"] == ["DTensor"]
        assert record["max_grad_diff"] < 1e-6
        assert record["extra_grad"] == [1.0, 1.0, 1.0]  # the plain parameter, unscaled alongside
        assert not record["skipped"] and record["scale"] == 256.0
        assert record["all_reduces"] == 1  # ours only: no extra DTensor reduction per bucket


@needs_fsdp2_on_cpu
def test_fsdp2_inf_in_one_ranks_local_shard_makes_every_rank_skip(ranks):
    records = ranks.run(_on_rank_fsdp2_step, True, world_size=2)
    assert [(r["skipped"], r["scale"]) for r in records] == [(True, 128.0), (True, 128.0)]


def _on_rank_fsdp1_step():
    rank = harness.current().rank
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(make_model(0), device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ShardedGradScaler("cpu", init_scale=256.0)
    scaler.scale(model(batch(0, rank=rank)).pow(2).mean()).backward()
    if rank == 1:
        next(model.parameters()).grad.view(-1)[0] = float("nan")
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)
    scaler.update()
    return {
        "skipped": all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)),
        "scale": scaler.get_scale(),
    }


def test_fsdp1_nan_on_one_rank_makes_every_rank_skip(ranks):
    assert ranks.run(_on_rank_fsdp1_step, world_size=2) == [{"skipped": True, "scale": 128.0}] * 2


def _on_rank_subgroup_agreement():
    """Agreement happens within the scaler's group only: {0,1} see rank 1's inf, {2,3} do not.

    The two subgroups are destroyed at the end: the ranks stay warm for later tests, and the
    default group (owned by the harness) is left alone.
    """
    rank = harness.current().rank
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    try:
        group = groups[rank // 2]
        param = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([param], lr=0.5)
        scaler = ShardedGradScaler("cpu", init_scale=2.0, process_group=group)
        scaler.scale(param.sum()).backward()
        if rank == 1:
            param.grad[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        return scaler.step_was_skipped(opt), scaler.get_scale()
    finally:
        for subgroup in groups:
            dist.destroy_process_group(subgroup)


def test_agreement_stays_within_the_process_group_on_4_ranks(ranks):
    assert ranks.run(_on_rank_subgroup_agreement, world_size=4) == [
        (True, 1.0),
        (True, 1.0),
        (False, 2.0),
        (False, 2.0),
    ]


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA: grads on CPU with the scale on the GPU"
)
def test_cpu_grads_with_a_cuda_scale_are_unscaled_and_checked():
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        param = torch.nn.Parameter(torch.ones(2))  # CPU parameter, as under CPU offload
        opt = torch.optim.SGD([param], lr=1.0)
        scaler = ShardedGradScaler("cuda", init_scale=4.0)
        scaler.scale(torch.ones((), device="cuda"))
        param.grad = torch.tensor([8.0, float("inf")])
        scaler.step(opt)
        scaler.update()
        assert scaler.step_was_skipped(opt) and scaler.get_scale() == 2.0
        assert param.grad[0].item() == 2.0
    finally:
        dist.destroy_process_group()
