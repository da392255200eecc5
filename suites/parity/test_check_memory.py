"""What a check holds beyond the training it checks: a replicated reference compares a share of
each tensor for its skip decision, its DDP buckets nothing it reduces by hand, a step it records
as live tensors is copied before it is kept, and a hand reduction lets each bucket's unreduced
gradients go as it reduces them; gradients are measured where they are, a replicated reference's
overflow is looked for in each rank's share, and a mesh's facts are asked once."""

from __future__ import annotations

import types
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from harness.parity.ranks import train
from harness.parity.ranks.measure import local, stepcheck
from harness.parity.ranks.sides import engines, references
from harness.parity.ranks.wire import RankStep, StepTensors
from harness.rank import context

_ENGINE = types.SimpleNamespace(local=lambda tensor: tensor, device=torch.device("cpu"))
"""A replicated engine's part the skip check reads: its local tensors are its whole ones."""


def _skip_decisions(changed: int | None) -> list[bool | None]:
    """Every rank builds the same groups; ``changed`` is the one element (of the first group's
    10) every rank changes alike, ``None`` for none; the second group is empty."""
    groups = [[torch.zeros(10), torch.zeros(3)], []]
    check = train.SharedSkipCheck(groups, _ENGINE)
    if changed is not None:
        groups[0][0][changed] = 1.0
    return check.skipped(groups, _ENGINE)


def test_a_change_in_any_ranks_share_is_a_step_on_every_rank(ranks):
    for changed in (0, 9):  # rank 0's share, rank 1's share
        assert ranks.run(_skip_decisions, changed, world_size=2) == [[False, None]] * 2, changed


def test_parameters_left_alone_are_a_skip_on_every_rank(ranks):
    assert ranks.run(_skip_decisions, None, world_size=2) == [[True, None]] * 2


def _share_sizes() -> list[int]:
    check = train.SharedSkipCheck([[torch.zeros(10), torch.zeros(3)]], _ENGINE)
    return [t.numel() for t in check.before[0]]


def test_each_rank_copies_only_its_share_of_the_parameters(ranks):
    assert ranks.run(_share_sizes, world_size=2) == [[5, 2], [5, 1]]


def _skip_checks(threshold_mb: float) -> list[str]:
    kept, train.SHARED_SKIP_MB = train.SHARED_SKIP_MB, threshold_mb
    try:
        groups = [[torch.zeros(1024)]]  # 4 KiB
        return [type(train.skip_check(role, groups, _ENGINE)).__name__ for role in ("reference", "candidate")]
    finally:
        train.SHARED_SKIP_MB = kept  # the pool's ranks run other tests after this one


def test_a_small_reference_decides_its_skips_alone_and_a_large_one_by_shares(ranks):
    assert ranks.run(_skip_checks, 1.0, world_size=2) == [["LocalSkipCheck", "LocalSkipCheck"]] * 2
    assert ranks.run(_skip_checks, 1 / 1024, world_size=2) == [["SharedSkipCheck", "LocalSkipCheck"]] * 2


def _forward_only(compiled: bool) -> tuple[list[str], list[float]]:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    if dist.get_rank() == 1:  # what DDP's broadcast from rank 0 must undo
        with torch.no_grad():
            for param in model.parameters():
                param.add_(1.0)
    wrapped = references.forward_only_ddp(model, torch.device("cpu"), compiled)
    bucketed = [name for name, p in model.named_parameters() if name not in wrapped.parameters_to_ignore]
    return bucketed, [float(p.sum()) for p in model.parameters()]


def test_a_hand_reduced_reference_buckets_one_parameter_and_holds_rank_0s_values(ranks):
    (names0, values0), (names1, values1) = ranks.run(_forward_only, False, world_size=2)
    assert names0 == names1 == ["1.bias"]  # the smallest
    assert values0 == values1


def test_a_compiled_reference_keeps_every_parameter_in_ddps_buckets(ranks):
    (names, _), _ = ranks.run(_forward_only, True, world_size=2)
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias"]


def _step(value: torch.Tensor) -> RankStep:
    tensors = StepTensors(params={"w": value}, grads={"w": value.clone()}, optim_state={"w": {"m": value}})
    return RankStep(loss=0.0, scale=1.0, tracker=0, found_inf=(0.0,), skipped=(False,), tensors=tensors)


def test_a_step_of_a_run_in_lockstep_is_copied_before_it_is_kept():
    live = torch.zeros(3)
    steps = stepcheck.ReferenceSteps([], live=iter([_step(live)]))
    held = steps.held(steps.step(0))
    live.add_(1.0)  # the run trains on
    assert held.tensors.params["w"].tolist() == [0.0] * 3
    assert held.tensors.optim_state["w"]["m"].tolist() == [0.0] * 3


def test_a_step_of_a_finished_run_is_kept_as_it_is():
    step = _step(torch.zeros(3))
    assert stepcheck.ReferenceSteps([step]).held(step) is step


def test_unscaling_lets_each_scaled_gradient_go_as_it_goes():
    scaled = {"a": torch.full((2,), 8.0), "b": torch.full((3,), 4.0, dtype=torch.bfloat16)}
    found = stepcheck.unscaled(scaled, 4.0)
    assert scaled == {}
    assert found["a"].tolist() == [2.0, 2.0] and found["b"].dtype == torch.bfloat16


def _replicated_engine(grads: list[torch.Tensor]) -> types.SimpleNamespace:
    """A replicated engine's part ``local.grads`` reads (no process group: rank 0 compares all)."""
    params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    return types.SimpleNamespace(named_trainable=lambda: [(f"p{i}", p) for i, p in enumerate(params)])


def test_a_whole_gradient_recorded_to_be_divided_is_not_copied_first():
    grads = [torch.arange(6.0).reshape(2, 3), torch.ones(4)]
    found = engines.Engine.full_grads(_replicated_engine(grads), copy=False)
    assert [found[n].data_ptr() for n in ("p0", "p1")] == [g.data_ptr() for g in grads]


def test_a_whole_gradient_recorded_as_it_is_is_a_copy():
    grads = [torch.arange(6.0).reshape(2, 3), torch.ones(4)]
    found = engines.Engine.full_grads(_replicated_engine(grads))
    for name, grad in zip(("p0", "p1"), grads, strict=True):
        assert found[name].data_ptr() != grad.data_ptr() and torch.equal(found[name], grad), name


def test_gradients_are_measured_where_they_are_not_copied():
    grads = [torch.arange(6.0).reshape(2, 3), torch.ones(4)]
    pieces, held = local.grads(_replicated_engine(grads), None)
    assert held == {"p0": True, "p1": True}
    for name, grad in zip(("p0", "p1"), grads, strict=True):
        assert pieces[name].values.data_ptr() == grad.data_ptr(), name


def test_scaled_gradients_are_measured_divided_in_their_own_dtype():
    grads = [torch.full((3,), 12.0), torch.full((2,), 6.0, dtype=torch.bfloat16)]
    pieces, _ = local.grads(_replicated_engine(grads), 4.0)
    assert pieces["p0"].values.tolist() == [3.0] * 3
    assert pieces["p1"].values.dtype == torch.bfloat16 and pieces["p1"].values.tolist() == [1.5] * 2
    assert grads[0].tolist() == [12.0] * 3  # the gradients the optimizer will read are left alone


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_the_ranks_shares_of_a_replicated_run_cover_each_element_once(world):
    tensors = {f"t{n}": torch.arange(float(n)) for n in (0, 1, 5, 7, 12)}
    for name, value in tensors.items():
        looked_at = [share for rank in range(world) for share in stepcheck.shares({name: value}, rank, world)]
        assert torch.cat(looked_at).tolist() == value.tolist(), (name, world)


class _Mesh:
    """A device mesh's part ``local._last_dim`` asks, counting the asks."""

    ndim = 1

    def __init__(self, coordinate: int) -> None:
        self.coordinate, self.asked = coordinate, 0

    def get_local_rank(self, dim: int) -> int:
        self.asked += 1
        return self.coordinate

    def size(self, dim: int | None = None) -> int:
        return 2


def test_a_meshs_facts_are_asked_once(monkeypatch):
    monkeypatch.setattr(local, "_rank_zero_group", lambda mesh, dim: True)
    mesh = _Mesh(1)
    assert local._last_dim(mesh) == local._last_dim(mesh) == (1, 2, True)
    assert mesh.asked == 1


def test_a_new_mesh_at_a_reused_address_is_asked_again(monkeypatch):
    monkeypatch.setattr(local, "_rank_zero_group", lambda mesh, dim: False)
    old, new = _Mesh(0), _Mesh(1)
    known = context.group_stash().setdefault(local._MESH_FACTS, dict)
    monkeypatch.setitem(known, id(new), (weakref.ref(old), (0, 2, True)))  # as if old had lived there
    assert local._last_dim(new) == (1, 2, False)


class _Float64Storages(TorchDispatchMode):
    """The storages of every float64 tensor of ``numel`` elements that an op returns."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.storages = numel, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_leaves(out):
            if (
                isinstance(value, torch.Tensor)
                and value.dtype == torch.float64
                and value.numel() == self.numel
            ):
                self.storages.add(value.untyped_storage().data_ptr())
        return out


def test_the_norms_parts_are_summed_from_one_float64_copy_of_the_gradients():
    """Each step sums the squares of the rank's gradients in float64: squared in the copy itself,
    one float64 copy of them at a time, not a second for the squares."""
    values = torch.randn(1000)
    pieces = {"w": local.Piece(values=values, start=0, shape=(1000,), dtype=torch.float32)}
    with _Float64Storages(1000) as seen:
        found = stepcheck.squares(pieces)
    assert len(seen.storages) == 1
    assert found == {"w": float(values.double().pow(2).sum())}
