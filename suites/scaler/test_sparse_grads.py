"""Sparse COO gradients: overflow that appears only once duplicates are summed, in every dtype.

A sparse grad with duplicate indices (an embedding looked up twice) holds values that are each
finite but may sum past the dtype's range; the optimizer applies that sum. Both scalers count it
as an overflow in fp16, bf16 and fp32 alike (torch's do only for fp16; docs/scaler.md's tables of
differences say why), while the optimizer keeps seeing exactly the values torch's would give it.
"""

import pytest
import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler

from scaler import GradScaler, ShardedGradScaler

# Per dtype: a value that is finite alone and not finite when added to itself.
HALF_PAST_RANGE = {torch.float16: 2.0**15, torch.bfloat16: 3.0e38, torch.float32: 3.0e38}
DTYPE_IDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def duplicated(value: float, dtype: torch.dtype, rows: int = 6) -> torch.Tensor:
    """A (rows, 3) sparse grad with two entries at row 1 (each ``value``) and one at row 4 (1.0)."""
    values = torch.tensor([[value] * 3, [value] * 3, [1.0] * 3]).to(dtype)
    return torch.sparse_coo_tensor(torch.tensor([[1, 1, 4]]), values, (rows, 3), check_invariants=True)


def train_one_step(scaler, grad: torch.Tensor):
    """One SGD step on a zero weight with ``grad``; returns (weight after, grad after step)."""
    weight = torch.nn.Parameter(torch.zeros(grad.shape, dtype=grad.dtype))
    opt = torch.optim.SGD([weight], lr=1.0)
    scaler.scale(torch.ones(()))
    weight.grad = grad
    scaler.step(opt)
    scaler.update()
    return weight.detach(), weight.grad


OURS = {"GradScaler": GradScaler, "ShardedGradScaler": ShardedGradScaler}
SCALERS = {kind: (lambda cls=cls: cls("cpu", init_scale=1.0)) for kind, cls in OURS.items()}
CASES = [
    ("GradScaler", torch.bfloat16),
    ("GradScaler", torch.float32),
    ("ShardedGradScaler", torch.float16),
    ("ShardedGradScaler", torch.bfloat16),
    ("ShardedGradScaler", torch.float32),
]


@pytest.mark.parametrize(("kind", "dtype"), CASES, ids=[f"{k}-{DTYPE_IDS[d]}" for k, d in CASES])
def test_duplicates_that_overflow_only_when_summed_skip_the_step_and_back_off(world_of_one, kind, dtype):
    scaler = SCALERS[kind]()
    weight, _ = train_one_step(scaler, duplicated(HALF_PAST_RANGE[dtype], dtype))
    assert torch.equal(weight, torch.zeros_like(weight)), "the optimizer stepped on an overflowing sum"
    assert scaler.get_scale() == 0.5


def test_grad_scaler_finds_fp16_sparse_overflow_in_unscale_grads_like_torch():
    """Plain GradScaler refuses fp16 grads in ``unscale_``; torch's own tests reach its fp16 sparse
    path through ``_unscale_grads_(..., allow_fp16=True)``, and so does this one."""
    found = []
    for scaler in (torch.amp.GradScaler("cpu"), GradScaler("cpu")):
        weight = torch.nn.Parameter(torch.zeros(6, 3, dtype=torch.float16))
        weight.grad = duplicated(2.0**15, torch.float16)
        opt = torch.optim.SGD([weight], lr=1.0)
        flags = scaler._unscale_grads_(opt, torch.ones(()), torch.zeros(()), True)
        found.append([flag.item() for flag in flags.values()])
    assert found == [[1.0], [1.0]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kind", ["GradScaler", "ShardedGradScaler"])
def test_torchs_scalers_let_the_optimizer_write_inf_where_ours_skip(world_of_one, kind, dtype):
    theirs = torch.amp.GradScaler if kind == "GradScaler" else TorchShardedGradScaler
    weight, _ = train_one_step(theirs("cpu", init_scale=1.0), duplicated(HALF_PAST_RANGE[dtype], dtype))
    assert weight[1].isinf().all(), "torch's scaler now catches this: drop the row of docs/scaler.md"
    weight, _ = train_one_step(SCALERS[kind](), duplicated(HALF_PAST_RANGE[dtype], dtype))
    assert torch.isfinite(weight).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kind", ["GradScaler", "ShardedGradScaler"])
def test_the_optimizer_sees_the_same_uncoalesced_grad_as_with_torchs_scaler(world_of_one, kind, dtype):
    """The check coalesces a copy: the grad itself keeps its duplicate entries, each unscaled."""
    theirs = torch.amp.GradScaler if kind == "GradScaler" else TorchShardedGradScaler
    ours = OURS[kind]
    results = []
    for cls in (theirs, ours):
        weight, grad = train_one_step(cls("cpu", init_scale=3.0), duplicated(6.0, dtype))
        results.append((weight, grad))
    (w_theirs, g_theirs), (w_ours, g_ours) = results
    assert not g_ours.is_coalesced()
    assert torch.equal(g_ours._indices(), g_theirs._indices())
    assert torch.equal(g_ours._values(), g_theirs._values())
    assert torch.equal(w_ours, w_theirs)


@pytest.mark.parametrize(
    ("theirs", "ours"),
    [(torch.amp.GradScaler, GradScaler), (TorchShardedGradScaler, ShardedGradScaler)],
    ids=["GradScaler", "ShardedGradScaler"],
)
def test_fp16_sparse_grads_are_coalesced_as_each_torch_scaler_does(world_of_one, theirs, ours):
    """torch's GradScaler sums fp16 duplicates in fp16, its ShardedGradScaler through fp32; the
    sums differ in the last bit, and each of ours gives its counterpart's."""
    generator = torch.Generator().manual_seed(0)
    indices = torch.randint(0, 5, (1, 200), generator=generator)
    values = (torch.randn(200, 3, generator=generator) * 100).half()
    grads = []
    for cls in (theirs, ours):
        scaler = cls("cpu", init_scale=1.0)
        scaler.scale(torch.ones(()))
        weight = torch.nn.Parameter(torch.zeros(5, 3, dtype=torch.float16))
        weight.grad = torch.sparse_coo_tensor(indices, values, (5, 3), check_invariants=True)
        scaler._unscale_grads_(torch.optim.SGD([weight], lr=1.0), torch.ones(()), torch.zeros(()), True)
        grads.append(weight.grad)
    assert grads[1].is_coalesced()
    assert torch.equal(grads[0].to_dense(), grads[1].to_dense())


class KernelInputs:
    """Records the numel of every tensor the unscale kernel ran over while active. A call the
    kernel refuses (a list holding a sparse tensor is refused before any tensor is touched) ran
    over nothing and is not recorded."""

    def __init__(self, monkeypatch) -> None:
        self.numels: list[int] = []
        real = torch._amp_foreach_non_finite_check_and_unscale_

        def recording(grads, found_inf, inv_scale):
            result = real(grads, found_inf, inv_scale)
            self.numels.extend(grad.numel() for grad in grads)
            return result

        monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", recording)


@pytest.mark.parametrize("kind", ["GradScaler", "ShardedGradScaler"])
def test_an_already_coalesced_sparse_grad_is_checked_in_one_pass(world_of_one, monkeypatch, kind):
    grad = duplicated(1.0, torch.float32).coalesce()  # rows 1 and 4: 2 x 3 values
    kernel = KernelInputs(monkeypatch)
    train_one_step(SCALERS[kind](), grad)
    assert kernel.numels == [6]


@pytest.mark.parametrize("kind", ["GradScaler", "ShardedGradScaler"])
def test_an_uncoalesced_sparse_grad_is_checked_with_its_sums(world_of_one, monkeypatch, kind):
    kernel = KernelInputs(monkeypatch)
    train_one_step(SCALERS[kind](), duplicated(1.0, torch.float32))
    assert sorted(kernel.numels) == [6, 9]  # the coalesced copy (2 rows) and the grad's 3 entries


def unscale_once(scaler, grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """``scaler.unscale_`` over one parameter per grad (scale 4); returns each ``.grad`` after it."""
    params = [torch.nn.Parameter(torch.zeros(grad.shape, dtype=grad.dtype)) for grad in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    scaler.scale(torch.ones(()))
    scaler.unscale_(torch.optim.SGD(params, lr=1.0))
    return [param.grad for param in params]


@pytest.mark.parametrize("kind", ["GradScaler", "ShardedGradScaler"])
def test_sparse_and_dense_grads_of_one_dtype_are_each_unscaled_once(world_of_one, kind):
    """One (device, dtype) group holding a sparse grad: every grad is divided by the scale once."""
    scaler = OURS[kind]("cpu", init_scale=4.0)
    dense, sparse = unscale_once(scaler, [torch.full((6, 3), 8.0), duplicated(8.0, torch.float32)])
    assert torch.equal(dense, torch.full((6, 3), 2.0))
    assert torch.equal(sparse._values(), duplicated(8.0, torch.float32)._values() / 4)


@pytest.mark.parametrize("kind", ["GradScaler", "ShardedGradScaler"])
def test_a_sparse_grad_in_one_dtype_does_not_unscale_another_dtypes_grads_twice(world_of_one, kind):
    """Two groups, the sparse grad in the second: the first group is unscaled once, not once before
    the sparse one is found and again after."""
    scaler = OURS[kind]("cpu", init_scale=4.0)
    dense = torch.full((6, 3), 8.0, dtype=torch.bfloat16)
    dense_after, sparse_after = unscale_once(scaler, [dense, duplicated(8.0, torch.float32)])
    assert torch.equal(dense_after, torch.full((6, 3), 2.0, dtype=torch.bfloat16))
    assert torch.equal(sparse_after._values(), duplicated(8.0, torch.float32)._values() / 4)
