"""The scaler's GPU tier (``make test-gpu``): the CPU suites' claims on CUDA and NCCL, plus what only
an accelerator allows (FSDP1 CPU offload, fp16 FSDP2 mixed precision, grads and scale on
different devices). Without enough GPUs every test here is skipped at collection with its reason.
"""

import pytest
import torch
import torch.distributed as dist

import harness
from fixtures.training import Step, assert_same_trajectory, batch, drive, make_model, make_optimizer
from scaler import GradScaler, ShardedGradScaler

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("optimizer", ["sgd", "adam_fused"])
def test_grad_scaler_matches_torch_on_cuda(optimizer):
    plan = [Step(), Step(overflow=True), Step(), Step(), Step(overflow=True), Step()]
    kwargs = {"init_scale": 1024.0, "growth_interval": 2}
    theirs = drive(torch.amp.GradScaler("cuda", **kwargs), plan, optimizer=optimizer, device="cuda")
    ours = drive(GradScaler("cuda", **kwargs), plan, optimizer=optimizer, device="cuda")
    assert_same_trajectory(theirs, ours)
    assert ours.skipped == [False, True, False, False, True, False]


def _gathered(value):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


@harness.distributed(world_size=2, backend="nccl")
@pytest.mark.parametrize("optimizer", ["sgd", "adam_fused"])
def test_nccl_inf_on_one_rank_makes_every_rank_skip(rank, world_size, optimizer):
    device = harness.current().device
    model = make_model(0).to(device)
    opt = make_optimizer(model, optimizer)
    scaler = ShardedGradScaler("cuda", init_scale=1024.0, growth_interval=2)
    skipped = []
    for step in range(3):
        opt.zero_grad()
        scaler.scale(model(batch(step, device=device)).pow(2).mean()).backward()
        if step == 1 and rank == 1:
            model[0].weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.step_was_skipped(opt))
    assert skipped == [False, True, False]
    assert _gathered(scaler.get_scale()) == [512.0] * world_size
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).cpu()
    assert all(torch.equal(params, other) for other in _gathered(params))


@harness.distributed(world_size=1, backend="nccl")
def test_fsdp2_fp16_mixed_precision_backs_off_then_trains(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = harness.current().device
    mesh = init_device_mesh("cuda", (world_size,))
    model = make_model(0, width=32).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float16)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = ShardedGradScaler("cuda", init_scale=2.0**30, growth_interval=5)
    losses = []
    for step in range(30):
        opt.zero_grad()
        loss = model(batch(step % 4, width=32, device=device)).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert scaler.skipped_steps >= 1  # 2**30 overflows fp16 gradients at first
    assert scaler.backoffs == scaler.skipped_steps
    assert losses[-1] < losses[0]


@harness.distributed(world_size=1, backend="nccl")
def test_fsdp1_cpu_offload_grads_on_cpu_with_the_scale_on_cuda(rank, world_size):
    from torch.distributed.fsdp import CPUOffload
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    device = harness.current().device
    model = FSDP(make_model(0), cpu_offload=CPUOffload(offload_params=True), device_id=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = ShardedGradScaler("cuda", init_scale=256.0)
    for overflow in (False, True):
        opt.zero_grad()
        scaler.scale(model(batch(0, device=device)).pow(2).mean()).backward()
        grad = next(model.parameters()).grad
        assert grad.device.type == "cpu"
        if overflow:
            grad.view(-1)[0] = float("inf")
        scaler.step(opt)
        scaler.update()
    assert scaler.step_was_skipped(opt)
    assert scaler.get_scale() == 128.0


@harness.distributed(world_size=1, backend="nccl")
@pytest.mark.parametrize("fused", [False, True], ids=["skip_decided_on_host", "fused_skip_on_device"])
def test_counters_on_a_cuda_scale_follow_the_plan(rank, world_size, fused):
    """On an accelerator the growth/backoff counts stay on the device (no host sync per update);
    the CPU suite's plan must give the same counts there."""
    device = harness.current().device
    scaler = ShardedGradScaler("cuda", init_scale=64.0, growth_interval=2)
    model = torch.nn.Linear(3, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=fused)
    for overflow in (False, False, True, False, True):
        opt.zero_grad()
        scaler.scale(model(torch.ones(2, 3, device=device)).sum()).backward()
        if overflow:
            model.bias.grad.fill_(float("nan"))
        scaler.step(opt)
        scaler.update()
    assert (scaler.steps, scaler.skipped_steps, scaler.growths, scaler.backoffs) == (5, 2, 1, 2)
    assert scaler.get_scale() == 32.0
