"""ShardedGradScaler as a drop-in for torch's wherever torch's contract is sound.

Each test does the same thing with torch's ``ShardedGradScaler`` and ours and compares, the way a
user (or torch's own scaler tests, which use the duck-typed ``DummyProcessGroup`` instead of
``init_process_group``) would switch from one to the other.
"""

import inspect
import pickle

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler
from torch.testing._internal.common_fsdp import DummyProcessGroup

from scaler import GradScaler, ShardedGradScaler

BOTH = pytest.mark.parametrize("cls", [TorchShardedGradScaler, ShardedGradScaler], ids=["torch", "ours"])


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"]
)
def test_scale_returns_each_outputs_dtype_like_torchs(dtype):
    """FSDP mixed precision code checks ``loss.dtype == param_dtype`` after scaling."""
    results = []
    for cls in (TorchShardedGradScaler, ShardedGradScaler):
        scaler = cls("cpu", init_scale=4.0, process_group=DummyProcessGroup(0, 1))
        loss = torch.tensor(3.0, dtype=dtype)
        nested = [torch.ones(2, dtype=dtype), (torch.full((1,), 2.0, dtype=dtype),)]
        results.append((scaler.scale(loss), scaler.scale(nested)))
    (loss_theirs, nested_theirs), (loss_ours, nested_ours) = results
    assert loss_ours.dtype == loss_theirs.dtype == dtype
    assert torch.equal(loss_ours, loss_theirs)
    assert [t.dtype for t in (nested_ours[0], nested_ours[1][0])] == [dtype, dtype]
    assert torch.equal(nested_ours[1][0], nested_theirs[1][0])


def test_grad_scaler_scale_keeps_torchs_type_promotion():
    """Plain GradScaler stays exactly torch.amp.GradScaler: an fp16 0-dim loss becomes float32."""
    loss = torch.tensor(3.0, dtype=torch.float16)
    theirs = torch.amp.GradScaler("cpu", init_scale=4.0).scale(loss)
    ours = GradScaler("cpu", init_scale=4.0).scale(loss)
    assert ours.dtype == theirs.dtype == torch.float32


def test_an_fp16_loss_scaled_past_fp16s_range_overflows_like_torchs():
    """Keeping the dtype means a too-large scale overflows the loss itself: backward sees inf, the
    step is skipped and the scale backs off (as with torch's)."""
    runs = []
    for cls in (TorchShardedGradScaler, ShardedGradScaler):
        scaler = cls("cpu", init_scale=2.0**16, process_group=DummyProcessGroup(0, 1))
        weight = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
        opt = torch.optim.SGD([weight], lr=1.0)
        scaler.scale((weight * 2).sum()).backward()
        runs.append((scaler.step(opt), weight.detach().clone()))
        scaler.update()
        runs[-1] += (scaler.get_scale(),)
    assert runs[0][0] is runs[1][0] is None
    assert torch.equal(runs[0][1], runs[1][1]) and runs[0][2] == runs[1][2] == 2.0**15


@BOTH
@pytest.mark.parametrize("fused", [False, True], ids=["sgd", "sgd_fused"])
def test_a_duck_typed_process_group_works_without_init_process_group(cls, fused):
    assert not dist.is_initialized()
    scaler = cls("cpu", init_scale=2.0, process_group=DummyProcessGroup(0, 1))
    weight = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([weight], lr=1.0, fused=fused)
    scaler.scale(torch.ones(()))
    weight.grad = torch.tensor([4.0, float("inf")])
    assert scaler.step(opt) is None or fused  # fused optimizers return their own value
    scaler.update()
    assert torch.equal(weight.detach(), torch.ones(2)) and scaler.get_scale() == 1.0
    weight.grad = torch.tensor([4.0, 2.0])
    scaler.step(opt)
    scaler.update()
    assert weight.detach().tolist() == [-3.0, -1.0]


@pytest.mark.parametrize(
    ("theirs", "ours"),
    [(torch.amp.GradScaler, GradScaler), (TorchShardedGradScaler, ShardedGradScaler)],
    ids=["GradScaler", "ShardedGradScaler"],
)
def test_private_unscale_grads_keeps_torchs_signature(theirs, ours):
    """torch's tests call ``_unscale_grads_(optimizer, inv_scale, found_inf)`` directly."""

    def described(cls):
        return [(p.name, p.default) for p in inspect.signature(cls._unscale_grads_).parameters.values()]

    assert described(ours) == described(theirs)


@BOTH
def test_unscale_grads_unscales_and_flags_sparse_grads_like_torchs_own_test(cls):
    """The body of torch's ``test_scaling_unscaling_sparse``, forced onto the CPU."""
    scaler = cls("cpu", init_scale=2.0, process_group=DummyProcessGroup(0, 1))
    inv_scale = torch.full((1,), 0.5)
    found_inf = torch.full((1,), 0.0)
    indices = torch.tensor([[0, 1, 1], [2, 0, 2]])
    s = torch.sparse_coo_tensor(indices, torch.tensor([16.0, 32.0, 64.0]), (2, 3), check_invariants=True)
    param = s.clone()
    param.grad = s.clone()
    opt = torch.optim.SGD([param], lr=1.0)
    assert scaler._unscale_grads_(opt, inv_scale, found_inf)[param.device].item() == 0.0
    assert torch.equal(param.grad.to_dense(), (s / 2).to_dense())
    param.grad = torch.sparse_coo_tensor(
        indices, torch.tensor([16.0, 32.0, float("inf")]), (2, 3), check_invariants=True
    )
    assert scaler._unscale_grads_(opt, inv_scale, found_inf)[param.device].item() == 1.0
    assert found_inf.item() == 0.0, "the caller's found_inf is copied, never written"
    half = torch.sparse_coo_tensor(  # duplicates at (0, 2) sum to 2**16: inf in fp16
        torch.tensor([[0, 1, 0], [2, 0, 2]]), torch.tensor([2.0**15, 1.0, 2.0**15]), (2, 3)
    ).half()
    param16 = half.clone()
    param16.grad = half.clone()
    opt16 = torch.optim.SGD([param16], lr=1.0)
    assert scaler._unscale_grads_(opt16, inv_scale, found_inf)[param16.device].item() == 1.0


@BOTH
def test_unscale_grads_without_any_grad_still_returns_a_flag_on_the_scale_device(cls):
    """A rank whose shards are all empty (``use_orig_params=True``) still takes part in agreement."""
    scaler = cls("cpu", init_scale=2.0, process_group=DummyProcessGroup(0, 1))
    scaler.scale(torch.ones(()))
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0)
    flags = scaler._unscale_grads_(opt, torch.full((1,), 0.5), torch.full((1,), 0.0))
    assert list(flags) == [torch.device("cpu")] and flags[torch.device("cpu")].item() == 0.0


def test_a_group_this_rank_is_not_part_of_is_accepted_like_torchs():
    """``new_group`` returns ``GroupMember.NON_GROUP_MEMBER`` on ranks outside the group."""
    outsider = dist.GroupMember.NON_GROUP_MEMBER
    assert TorchShardedGradScaler("cpu", process_group=outsider).is_enabled()
    assert ShardedGradScaler("cpu", process_group=outsider).is_enabled()


def test_a_scaler_with_a_duck_typed_group_pickles_with_its_group():
    scaler = ShardedGradScaler("cpu", init_scale=8.0, process_group=DummyProcessGroup(0, 1))
    restored = pickle.loads(pickle.dumps(scaler))
    assert isinstance(restored.process_group, DummyProcessGroup)
    assert restored.state_dict() == scaler.state_dict()


@pytest.mark.parametrize("bad", ["world", 3, object()], ids=["str", "int", "object"])
def test_an_object_that_cannot_be_a_group_is_rejected_naming_the_argument(bad):
    with pytest.raises(TypeError, match=r"process_group must be a torch.distributed.ProcessGroup, an object"):
        ShardedGradScaler("cpu", process_group=bad)
