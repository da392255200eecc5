"""The per-optimizer records (``_per_optimizer_states``) are torch's, record for record.

Code written against torch's scalers reads and compares these private records: torch's own
``test_pickle_gradscaler`` compares one with ``torch.amp.grad_scaler._refresh_per_optimizer_state()``.
So each test builds the same record with torch's scaler and ours and compares them as torch's code
would: the same keys, the stage a member of torch's own ``OptState``, the same found_inf flags.
"""

import pickle

import pytest
import torch
from torch.amp.grad_scaler import OptState as TorchOptState
from torch.amp.grad_scaler import _refresh_per_optimizer_state
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as TorchShardedGradScaler
from torch.testing._internal.common_fsdp import DummyProcessGroup

import scaler
from scaler import GradScaler, ShardedGradScaler

PAIRS = pytest.mark.parametrize(
    ("theirs", "ours"),
    [
        (lambda: torch.amp.GradScaler("cpu", init_scale=4.0), lambda: GradScaler("cpu", init_scale=4.0)),
        (
            lambda: TorchShardedGradScaler("cpu", init_scale=4.0, process_group=DummyProcessGroup(0, 1)),
            lambda: ShardedGradScaler("cpu", init_scale=4.0, process_group=DummyProcessGroup(0, 1)),
        ),
    ],
    ids=["GradScaler", "ShardedGradScaler"],
)


def described(record):
    """What torch's code reads of a record: its keys, its stage, and each device's flag value.

    Flag shapes are left out: torch's ShardedGradScaler makes shape-[1] flags where ours are 0-d
    (a deliberate difference, in docs/scaler.md's table of differences)."""
    flags = {device: (flag.dtype, flag.item()) for device, flag in record["found_inf_per_device"].items()}
    return sorted(record), record["stage"], flags


def iteration(make_scaler, *, grad, unscale_first):
    """One iteration on one parameter whose grad is ``grad``; the record after unscale_ (or None)
    and after step."""
    scaler_ = make_scaler()
    weight = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([weight], lr=1.0)
    scaler_.scale(torch.ones(()))
    weight.grad = grad.clone()
    unscaled = None
    if unscale_first:
        scaler_.unscale_(opt)
        unscaled = described(scaler_._per_optimizer_states[id(opt)])
    scaler_.step(opt)
    return unscaled, described(scaler_._per_optimizer_states[id(opt)])


def test_the_stage_enum_is_torchs_own():
    assert scaler.OptState is TorchOptState


@pytest.mark.parametrize(
    "make",
    [lambda: GradScaler("cpu", init_scale=3.0), lambda: ShardedGradScaler("cpu", init_scale=3.0)],
    ids=["GradScaler", "ShardedGradScaler"],
)
def test_a_fresh_record_equals_torchs_fresh_record_before_and_after_pickling(make):
    """The comparison torch's ``test_pickle_gradscaler`` makes (any key makes a fresh record)."""
    original = make()
    original.scale(torch.ones(()))
    restored = pickle.loads(pickle.dumps(original))
    assert original._per_optimizer_states["fdsa"] == _refresh_per_optimizer_state()
    assert restored._per_optimizer_states["fdsa"] == _refresh_per_optimizer_state()


@PAIRS
@pytest.mark.parametrize("grad", [[4.0, 2.0], [4.0, float("inf")]], ids=["clean", "overflow"])
@pytest.mark.parametrize("unscale_first", [False, True], ids=["step", "unscale_then_step"])
def test_records_after_unscale_and_step_equal_torchs(theirs, ours, grad, unscale_first):
    expected = iteration(theirs, grad=torch.tensor(grad), unscale_first=unscale_first)
    got = iteration(ours, grad=torch.tensor(grad), unscale_first=unscale_first)
    assert got == expected
    assert got[1][1] is TorchOptState.STEPPED
