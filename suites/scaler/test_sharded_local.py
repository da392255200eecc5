"""ShardedGradScaler in one process: construction, defaults, bounds, counters, pickling, dtypes.

Torch's ShardedGradScaler is shown side by side where we deliberately differ (docs/architecture.md, sections 1 and 2.2).
"""

import copy
import pickle

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

from fixtures.training import Step, assert_same_trajectory, drive
from scaler import GradScaler, ScalerArgumentError, ShardedGradScaler, default_device

needs_no_accelerator = pytest.mark.skipif(
    torch.accelerator.is_available(),
    reason="this machine has an accelerator; the CPU-default case does not apply",
)


@needs_no_accelerator
def test_default_device_is_cpu_without_an_accelerator_and_the_scaler_stays_enabled():
    assert default_device() == "cpu"
    assert ShardedGradScaler().is_enabled()


@needs_no_accelerator
def test_torchs_default_silently_disables_itself_on_a_cpu_machine():
    with pytest.warns(UserWarning, match="Disabling"):
        assert not TorchShardedGradScaler().is_enabled()


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_an_unavailable_device_is_an_error_not_a_silent_disable():
    with pytest.raises(ValueError, match="device='cuda' is not available on this machine; pass device='cpu'"):
        ShardedGradScaler("cuda")
    assert not ShardedGradScaler("cuda", enabled=False).is_enabled()


def test_arguments_after_init_scale_are_keyword_only():
    with pytest.raises(TypeError):
        ShardedGradScaler("cpu", 2.0**16, 2.0)  # torch's two scalers order these differently


def test_init_scale_outside_the_bounds_is_rejected():
    with pytest.raises(
        ValueError, match=r"init_scale=65536.0 lies outside \[min_scale=None, max_scale=1024.0\]"
    ):
        ShardedGradScaler("cpu", max_scale=1024.0)
    with pytest.raises(ScalerArgumentError, match="min_scale must be a finite number > 0"):
        ShardedGradScaler("cpu", min_scale=-1.0)


def test_process_group_is_resolved_lazily_and_named_when_missing():
    scaler = ShardedGradScaler("cpu")  # no process group exists yet: construction must not need one
    with pytest.raises(RuntimeError, match=r"call torch.distributed.init_process_group\(...\) first"):
        _ = scaler.process_group


def test_none_means_the_default_group(world_of_one):
    assert ShardedGradScaler("cpu").process_group is dist.group.WORLD


def test_scale_never_grows_to_inf_where_torchs_cpu_update_does(world_of_one):
    plan = [Step()] * 2
    kwargs = {"init_scale": 2.0**127, "growth_interval": 1}
    theirs = drive(TorchShardedGradScaler("cpu", **kwargs), plan, loss_factor=2.0**-126)
    ours = drive(ShardedGradScaler("cpu", **kwargs), plan, loss_factor=2.0**-126)
    assert theirs.scales == [float("inf"), float("inf")]
    assert ours.scales == [2.0**127, 2.0**127]


@pytest.mark.parametrize("fused", [False, True], ids=["skip_decided_on_host", "fused_skip_on_device"])
def test_counters_and_step_was_skipped_follow_the_plan(world_of_one, fused):
    scaler = ShardedGradScaler("cpu", init_scale=64.0, growth_interval=2)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=fused)
    skipped = []
    for overflow in (False, False, True, False, True):
        opt.zero_grad()
        scaler.scale(model(torch.ones(2, 3)).sum()).backward()
        if overflow:
            model.bias.grad.fill_(float("nan"))
        scaler.step(opt)
        scaler.update()
        skipped.append(scaler.step_was_skipped(opt))
    assert skipped == [False, False, True, False, True]
    assert (scaler.steps, scaler.skipped_steps, scaler.growths, scaler.backoffs) == (5, 2, 1, 2)
    assert scaler.get_scale() == 32.0  # 64 -> grow 128 -> back off 64 -> back off 32


@pytest.mark.parametrize(
    "kinds",
    [("fused", "fused"), ("plain", "fused"), ("plain", "plain")],
    ids=["fused+fused", "plain+fused", "plain+plain"],
)
def test_two_optimizers_overflowing_in_one_iteration_back_off_once_and_skip_each(world_of_one, kinds):
    scaler = ShardedGradScaler("cpu", init_scale=64.0)
    models = [torch.nn.Linear(3, 1) for _ in kinds]
    opts = [
        torch.optim.Adam(m.parameters(), lr=0.1, fused=kind == "fused")
        for m, kind in zip(models, kinds, strict=True)
    ]
    scaler.scale(sum(model(torch.ones(2, 3)).sum() for model in models)).backward()
    for model in models:
        model.bias.grad.fill_(float("inf"))
    for opt in opts:
        scaler.step(opt)
    scaler.update()
    assert [scaler.step_was_skipped(opt) for opt in opts] == [True, True]
    assert (scaler.steps, scaler.skipped_steps, scaler.backoffs, scaler.growths) == (2, 2, 1, 0)
    assert scaler.get_scale() == 32.0


def test_load_state_dict_into_a_scaler_that_has_stepped_restores_scale_and_tracker_like_torchs(world_of_one):
    saved = {
        "scale": 256.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "_growth_tracker": 2,
    }
    runs = []
    for cls in (TorchShardedGradScaler, ShardedGradScaler):
        scaler = cls("cpu", init_scale=1024.0, growth_interval=5)
        drive(scaler, [Step(), Step(overflow=True), Step()])  # the scale and tracker tensors exist
        scaler.load_state_dict(saved)
        assert (scaler.get_scale(), scaler._get_growth_tracker()) == (256.0, 2)
        runs.append(drive(scaler, [Step(), Step()]))
    assert_same_trajectory(*runs)
    assert runs[1].scales == [512.0, 512.0]


def test_step_was_skipped_before_any_step_names_the_fix():
    scaler = ShardedGradScaler("cpu")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(ValueError, match=r"call scaler.step\(optimizer\) first"):
        scaler.step_was_skipped(opt)


def test_max_and_min_scale_bound_the_trajectory(world_of_one):
    plan = [Step()] * 3 + [Step(overflow=True)] * 3
    run = drive(
        ShardedGradScaler("cpu", init_scale=8.0, growth_interval=1, max_scale=16.0, min_scale=4.0), plan
    )
    assert run.scales == [16.0, 16.0, 16.0, 8.0, 4.0, 4.0]


def test_new_scale_outside_the_bounds_is_rejected(world_of_one):
    scaler = ShardedGradScaler("cpu", init_scale=8.0, max_scale=16.0)
    scaler.scale(torch.ones(()))
    with pytest.raises(ValueError, match=r"new_scale=32.0 lies outside \[min_scale=None, max_scale=16.0\]"):
        scaler.update(32.0)


def test_fp16_grads_are_unscaled(world_of_one):
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    opt = torch.optim.SGD([param], lr=1.0)
    scaler = ShardedGradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))
    param.grad = torch.full((4,), 8.0, dtype=torch.float16)
    scaler.unscale_(opt)
    assert param.grad.dtype == torch.float16 and param.grad.tolist() == [2.0] * 4


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_a_non_finite_dense_fp16_grad_skips_the_step(world_of_one, bad):
    """FSDP mixed precision hands the scaler fp16 grads: an inf or NaN in one must be found."""
    param = torch.nn.Parameter(torch.ones(4, dtype=torch.float16))
    opt = torch.optim.SGD([param], lr=1.0)
    scaler = ShardedGradScaler("cpu", init_scale=4.0)
    scaler.scale(torch.ones(()))
    param.grad = torch.tensor([8.0, bad, 8.0, 8.0], dtype=torch.float16)
    scaler.step(opt)
    scaler.update()
    assert scaler.step_was_skipped(opt) and scaler.get_scale() == 2.0
    assert param.tolist() == [1.0] * 4


def test_fp16_sparse_duplicates_that_overflow_when_coalesced_are_found(world_of_one):
    weight = torch.nn.Parameter(torch.zeros(6, 3, dtype=torch.float16))
    opt = torch.optim.SGD([weight], lr=1.0)
    scaler = ShardedGradScaler("cpu", init_scale=1.0)
    scaler.scale(torch.ones(()))
    # Each value is finite in fp16; at index 1 they sum to 2**16, past fp16's largest finite value.
    values = torch.full((2, 3), 2.0**15, dtype=torch.float16)
    weight.grad = torch.sparse_coo_tensor(torch.tensor([[1, 1]]), values, (6, 3), check_invariants=True)
    scaler.step(opt)
    scaler.update()
    assert scaler.step_was_skipped(opt)
    assert torch.equal(weight.detach(), torch.zeros(6, 3, dtype=torch.float16))


def test_pickle_and_deepcopy_keep_a_custom_group(world_of_one):
    group = dist.new_group([0])
    scaler = ShardedGradScaler("cpu", init_scale=32.0, growth_interval=7, process_group=group)
    with pytest.raises(TypeError, match="cannot pickle"):  # torch's cannot be pickled with a group set
        pickle.dumps(TorchShardedGradScaler("cpu", process_group=group))
    for restored in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert restored.process_group.group_name == group.group_name
        assert restored.state_dict() == scaler.state_dict()
        assert restored.get_growth_interval() == 7


def test_pickle_keeps_counters(world_of_one):
    scaler = ShardedGradScaler("cpu", init_scale=8.0, growth_interval=1)
    drive(scaler, [Step(), Step(overflow=True)])
    restored = pickle.loads(pickle.dumps(scaler))
    assert (restored.steps, restored.skipped_steps, restored.growths, restored.backoffs) == (2, 1, 1, 1)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_matches_torchs_sharded_scaler_where_torchs_is_correct(world_of_one, optimizer):
    """Away from torch's bugs (no fused optimizer, no growth past float32), the trajectories agree."""
    plan = [Step(), Step(overflow=True), Step(), Step(), Step(), Step(overflow=True), Step()]
    kwargs = {"init_scale": 2.0**12, "growth_interval": 2, "growth_factor": 3.0, "backoff_factor": 0.25}
    theirs = drive(TorchShardedGradScaler("cpu", **kwargs), plan, optimizer=optimizer)
    ours = drive(ShardedGradScaler("cpu", **kwargs), plan, optimizer=optimizer)
    assert_same_trajectory(theirs, ours)


def test_follows_the_same_rule_as_grad_scaler(world_of_one):
    plan = [Step(overflow=i % 3 == 1) for i in range(9)]
    kwargs = {"init_scale": 2.0**12, "growth_interval": 2}
    assert_same_trajectory(
        drive(GradScaler("cpu", **kwargs), plan), drive(ShardedGradScaler("cpu", **kwargs), plan)
    )
