"""ShardedOptimizer (docs/architecture.md, section 2.3), in one process: the torch.optim.Optimizer contract, name-keyed
state, AMP forwarding to a fused local optimizer, and the messages for bad input.

Plain tensors need no process group; the few DTensor checks here use a one-rank group in this
process. Multi-rank behaviour (DTensor/ShardedTensor shards, resharding, the scaler) lives in
``test_sharded_optimizer_distributed.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

from scaler import ShardedOptimizer


def _named(seed: int = 0) -> dict[str, torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "layer.weight": torch.nn.Parameter(torch.randn(3, 2, generator=generator)),
        "layer.bias": torch.nn.Parameter(torch.randn(2, generator=generator)),
    }


def _backward(params: dict[str, torch.Tensor], step: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(100 + step)
    loss = sum((p * torch.randn(p.shape, generator=generator)).pow(2).sum() for p in params.values())
    loss.backward()
    return loss.detach()


def _train(params: dict[str, torch.Tensor], opt: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        opt.zero_grad()
        _backward(params, step)
        opt.step()


def _clone(params: dict[str, torch.Tensor]) -> dict[str, torch.nn.Parameter]:
    return {name: torch.nn.Parameter(p.detach().clone()) for name, p in params.items()}


# -- the torch.optim.Optimizer contract ----------------------------------------------------------


def test_is_a_torch_optimizer_whose_param_groups_hold_the_parameters_and_defaults() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1, momentum=0.9)
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.defaults["momentum"] == 0.9
    assert opt.param_groups[0]["lr"] == 0.1
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(p) for p in params.values()]


def test_steps_exactly_like_the_local_optimizer_on_the_same_tensors() -> None:
    ours, theirs = _named(), _named()
    opt = ShardedOptimizer(ours, torch.optim.Adam, lr=0.05)
    reference = torch.optim.Adam(list(theirs.values()), lr=0.05)
    _train(ours, opt, range(3))
    _train(theirs, reference, range(3))
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=name)


def test_accepts_named_parameters_of_a_module() -> None:
    model = torch.nn.Linear(3, 2)
    opt = ShardedOptimizer(model.named_parameters(), torch.optim.SGD, lr=0.1)
    assert opt.state_dict()["param_groups"][0]["params"] == ["weight", "bias"]


def test_step_returns_the_loss_its_closure_returned() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)

    returned: list[torch.Tensor] = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        returned.append(_backward(params))
        return returned[-1]

    assert opt.step(closure) is returned[0]


def test_step_without_closure_returns_none() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
    _backward(params)
    assert opt.step() is None


def test_step_pre_and_post_hooks_run_around_every_step() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
    calls: list[str] = []
    opt.register_step_pre_hook(lambda optimizer, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda optimizer, args, kwargs: calls.append("post"))
    _train(params, opt, range(2))
    assert calls == ["pre", "post", "pre", "post"]


def test_zero_grad_sets_grads_to_none_by_default() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
    _backward(params)
    opt.zero_grad()
    assert all(p.grad is None for p in params.values())


def test_zero_grad_with_set_to_none_false_keeps_zero_tensors() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
    _backward(params)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in params.values())


def test_add_param_group_accepts_named_parameters_with_their_own_options() -> None:
    params = _named()
    extra = {"head.weight": torch.nn.Parameter(torch.ones(2))}
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
    opt.add_param_group({"params": extra, "lr": 0.5})
    extra["head.weight"].grad = torch.ones(2)
    opt.step()
    groups = opt.state_dict()["param_groups"]
    assert [(g["params"], g["lr"]) for g in groups] == [
        (["layer.weight", "layer.bias"], 0.1),
        (["head.weight"], 0.5),
    ]
    assert torch.equal(extra["head.weight"].detach(), torch.full((2,), 0.5))


def test_constructor_accepts_a_list_of_named_param_groups() -> None:
    params = _named()
    opt = ShardedOptimizer(
        [
            {"params": {"layer.weight": params["layer.weight"]}},
            {"params": {"layer.bias": params["layer.bias"]}, "lr": 1.0},
        ],
        torch.optim.SGD,
        lr=0.1,
    )
    assert [g["lr"] for g in opt.param_groups] == [0.1, 1.0]


def test_lr_scheduler_drives_the_local_optimizer_also_after_load_state_dict() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    opt.load_state_dict(opt.state_dict())
    _train(params, opt, range(1))
    scheduler.step()
    assert opt.local_optimizer.param_groups[0]["lr"] == 0.5


def test_cannot_be_pickled_or_copied_silently() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.SGD, lr=0.1)
    message = _error(lambda: copy.deepcopy(opt), TypeError)
    assert message.startswith("ShardedOptimizer cannot be pickled or copied; save opt.state_dict()")


# -- AMP: a fused local optimizer stays on its fused scaling path -------------------------------


def test_fused_local_optimizer_makes_the_wrapper_support_amp_scaling() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.Adam, lr=0.1, fused=True)
    assert opt._step_supports_amp_scaling is True


def test_unfused_local_optimizer_leaves_amp_scaling_to_the_scaler() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.Adam, lr=0.1)
    assert opt._step_supports_amp_scaling is False


def test_forwarded_found_inf_makes_the_fused_step_skip() -> None:
    params = _named()
    before = {name: p.detach().clone() for name, p in params.items()}
    opt = ShardedOptimizer(params, torch.optim.Adam, lr=0.1, fused=True)
    _backward(params)
    opt.grad_scale = torch.tensor(1.0)
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    assert all(torch.equal(params[name].detach(), before[name]) for name in params)


def test_forwarded_grad_scale_is_unscaled_inside_the_fused_step() -> None:
    scaled, plain = _named(), _named()
    fused = ShardedOptimizer(scaled, torch.optim.Adam, lr=0.1, fused=True)
    reference = torch.optim.Adam(list(plain.values()), lr=0.1, fused=True)
    _backward(plain)
    for name, p in scaled.items():
        p.grad = plain[name].grad * 1024.0
    fused.grad_scale = torch.tensor(1024.0)
    fused.found_inf = torch.tensor(0.0)
    fused.step()
    reference.step()
    for name in scaled:
        torch.testing.assert_close(scaled[name], plain[name], rtol=0, atol=0, msg=name)


def test_amp_attributes_are_only_lent_to_the_local_optimizer_for_one_step() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.Adam, lr=0.1, fused=True)
    _backward(params)
    opt.grad_scale = torch.tensor(1.0)
    opt.found_inf = torch.tensor(0.0)
    opt.step()
    assert not hasattr(opt.local_optimizer, "grad_scale") and not hasattr(opt.local_optimizer, "found_inf")


# -- state_dict / load_state_dict ----------------------------------------------------------------


def test_state_dict_has_torch_layout_with_names_for_indices() -> None:
    ours, theirs = _named(), _named()
    opt = ShardedOptimizer(ours, torch.optim.Adam, lr=0.05)
    reference = torch.optim.Adam(list(theirs.values()), lr=0.05)
    _train(ours, opt, range(2))
    _train(theirs, reference, range(2))
    saved, expected = opt.state_dict(), reference.state_dict()
    assert set(saved) == {"state", "param_groups", "optimizer_class"}
    assert saved["optimizer_class"] == "torch.optim.adam.Adam"
    assert saved["param_groups"] == [
        {**expected["param_groups"][0], "params": ["layer.weight", "layer.bias"]}
    ]
    for index, name in enumerate(ours):
        assert saved["state"][name].keys() == expected["state"][index].keys()
        for key, value in saved["state"][name].items():
            torch.testing.assert_close(
                value, expected["state"][index][key], rtol=0, atol=0, msg=f"{name}.{key}"
            )


def test_state_dict_hooks_run() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.SGD, lr=0.1)
    calls: list[str] = []
    opt.register_state_dict_pre_hook(lambda optimizer: calls.append("pre"))
    opt.register_state_dict_post_hook(lambda optimizer, state_dict: {**state_dict, "extra": 1})
    assert opt.state_dict()["extra"] == 1 and calls == ["pre"]


def test_load_state_dict_hooks_run() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.SGD, lr=0.1)
    calls: list[str] = []
    opt.register_load_state_dict_pre_hook(lambda optimizer, state_dict: calls.append("pre"))
    opt.register_load_state_dict_post_hook(lambda optimizer: calls.append("post"))
    opt.load_state_dict(opt.state_dict())
    assert calls == ["pre", "post"]


def test_round_trip_continues_exactly_like_uninterrupted_training() -> None:
    original = _named()
    opt = ShardedOptimizer(original, torch.optim.Adam, lr=0.05)
    _train(original, opt, range(2))
    copy = _clone(original)
    restored = ShardedOptimizer(copy, torch.optim.Adam, lr=0.05)
    restored.load_state_dict(opt.state_dict())
    _train(original, opt, range(2, 4))
    _train(copy, restored, range(2, 4))
    for name in original:
        torch.testing.assert_close(copy[name], original[name], rtol=0, atol=0, msg=name)


def test_loaded_state_is_a_copy_not_a_view_of_the_state_dict() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1, momentum=0.9)
    _train(params, opt, range(1))
    saved = opt.state_dict()
    restored = ShardedOptimizer(_clone(params), torch.optim.SGD, lr=0.1, momentum=0.9)
    restored.load_state_dict(saved)
    saved["state"]["layer.bias"]["momentum_buffer"].zero_()
    assert restored.state_dict()["state"]["layer.bias"]["momentum_buffer"].any()


def test_load_matches_parameters_by_name_not_by_position() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1, momentum=0.9)
    _train(params, opt, range(1))
    reordered = dict(reversed(list(_clone(params).items())))
    restored = ShardedOptimizer(reordered, torch.optim.SGD, lr=0.1, momentum=0.9)
    restored.load_state_dict(opt.state_dict())
    for name, p in params.items():
        assert torch.equal(
            restored.state[reordered[name]]["momentum_buffer"], opt.state[p]["momentum_buffer"]
        )


def test_load_restores_hyperparameters_of_each_group() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.SGD, lr=0.1)
    restored = ShardedOptimizer(_named(), torch.optim.SGD, lr=0.7)
    restored.load_state_dict(opt.state_dict())
    assert restored.param_groups[0]["lr"] == 0.1


def test_initialize_state_creates_state_without_touching_parameters_or_grads() -> None:
    params = _named()
    params["layer.bias"].grad = torch.ones(2)
    before = {name: p.detach().clone() for name, p in params.items()}
    opt = ShardedOptimizer(params, torch.optim.Adam, lr=0.1, weight_decay=0.1)
    opt.initialize_state()
    assert set(opt.state_dict()["state"]) == set(params)
    assert all(torch.equal(params[name].detach(), before[name]) for name in params)
    assert params["layer.weight"].grad is None and torch.equal(params["layer.bias"].grad, torch.ones(2))


def test_initialized_state_is_replaced_by_the_loaded_state() -> None:
    params = _named()
    fresh = ShardedOptimizer(params, torch.optim.Adam, lr=0.1)
    empty_state = fresh.state_dict()
    opt = ShardedOptimizer(_clone(params), torch.optim.Adam, lr=0.1)
    opt.initialize_state()
    opt.load_state_dict(empty_state)
    assert opt.state_dict()["state"] == {}


# -- bad input: every message names the parameter and the fix -----------------------------------


def _error(action: Any, error: type[Exception]) -> str:
    with pytest.raises(error) as info:
        action()
    return str(info.value)


def test_rejects_an_optimizer_class_that_is_not_a_torch_optimizer() -> None:
    message = _error(lambda: ShardedOptimizer(_named(), "adam", lr=0.1), TypeError)
    assert "optimizer_class must be a torch.optim.Optimizer subclass" in message


def test_rejects_unnamed_parameters() -> None:
    message = _error(lambda: ShardedOptimizer(list(_named().values()), torch.optim.SGD, lr=0.1), TypeError)
    assert "item 0 is a Parameter" in message and "model.named_parameters()" in message


def test_rejects_a_value_that_is_not_a_tensor_naming_it() -> None:
    message = _error(lambda: ShardedOptimizer({"w": [1.0, 2.0]}, torch.optim.SGD, lr=0.1), TypeError)
    assert message.startswith("parameter 'w' is a list")


def test_rejects_a_non_leaf_tensor_naming_it() -> None:
    leaf = torch.ones(2, requires_grad=True)
    message = _error(lambda: ShardedOptimizer({"w": leaf * 2}, torch.optim.SGD, lr=0.1), ValueError)
    assert message.startswith("parameter 'w' is not a leaf tensor")


def test_rejects_empty_parameters() -> None:
    message = _error(lambda: ShardedOptimizer({}, torch.optim.SGD, lr=0.1), ValueError)
    assert message == "parameter group 0 is empty; give at least one named parameter"


def test_add_param_group_rejects_a_name_already_in_another_group() -> None:
    params = _named()
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
    message = _error(
        lambda: opt.add_param_group({"params": {"layer.bias": torch.nn.Parameter(torch.ones(2))}}), ValueError
    )
    assert message.startswith("parameter 'layer.bias' of parameter group 1 is already in parameter group 0")


def test_add_param_group_rejects_unnamed_tensors() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.SGD, lr=0.1)
    message = _error(lambda: opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]}), TypeError)
    assert "parameter group 1 must hold named parameters" in message


def _trained_state(opt_class: type[torch.optim.Optimizer] = torch.optim.Adam) -> dict[str, Any]:
    params = _named()
    opt = ShardedOptimizer(params, opt_class, lr=0.1)
    _train(params, opt, range(1))
    return opt.state_dict()


def test_load_rejects_state_of_a_parameter_the_optimizer_does_not_have() -> None:
    saved = _trained_state()
    saved["state"]["layer.extra"] = {}
    opt = ShardedOptimizer(_named(), torch.optim.Adam, lr=0.1)
    message = _error(lambda: opt.load_state_dict(saved), ValueError)
    assert message == (
        "state_dict has state for parameter 'layer.extra', which this optimizer does not have; "
        "optimizer parameters: ['layer.weight', 'layer.bias']"
    )


def test_load_rejects_a_state_dict_without_an_entry_for_a_parameter() -> None:
    saved = _trained_state()
    params = {**_named(), "head.weight": torch.nn.Parameter(torch.ones(2))}
    opt = ShardedOptimizer(params, torch.optim.Adam, lr=0.1)
    message = _error(lambda: opt.load_state_dict(saved), ValueError)
    assert message == (
        "state_dict has no entry for parameter 'head.weight' of parameter group 0; "
        "saved parameters of that group: ['layer.weight', 'layer.bias']"
    )


def test_load_rejects_a_state_shape_that_differs_from_the_parameter() -> None:
    saved = _trained_state()
    params = _named()
    params["layer.weight"] = torch.nn.Parameter(torch.ones(4, 2))
    opt = ShardedOptimizer(params, torch.optim.Adam, lr=0.1)
    message = _error(lambda: opt.load_state_dict(saved), ValueError)
    assert message.startswith(
        "parameter 'layer.weight': saved optimizer state 'exp_avg' has shape (3, 2), but the parameter has shape (4, 2)"
    )


def test_load_rejects_the_state_of_another_optimizer_class() -> None:
    saved = _trained_state(torch.optim.Adagrad)
    opt = ShardedOptimizer(_named(), torch.optim.Adam, lr=0.1)
    message = _error(lambda: opt.load_state_dict(saved), ValueError)
    assert message == (
        "state_dict was saved by torch.optim.adagrad.Adagrad, but this ShardedOptimizer steps "
        "torch.optim.adam.Adam; cannot load the state of parameters ['layer.bias', 'layer.weight']"
    )


def test_load_rejects_a_different_number_of_param_groups() -> None:
    saved = _trained_state()
    opt = ShardedOptimizer(_named(), torch.optim.Adam, lr=0.1)
    opt.add_param_group({"params": {"head.weight": torch.nn.Parameter(torch.ones(2))}})
    message = _error(lambda: opt.load_state_dict(saved), ValueError)
    assert message.startswith("state_dict has 1 parameter groups, this optimizer has 2")


def test_load_rejects_something_that_is_not_a_state_dict() -> None:
    opt = ShardedOptimizer(_named(), torch.optim.Adam, lr=0.1)
    message = _error(lambda: opt.load_state_dict({"layer.weight": torch.ones(3, 2)}), TypeError)
    assert message.startswith("state_dict must be a mapping with 'state' and 'param_groups' entries")


# -- DTensor on a one-rank group in this process -------------------------------------------------


def test_dtensor_state_is_saved_as_a_dtensor_with_the_parameter_placements(world_of_one: Any) -> None:
    mesh = init_device_mesh("cpu", (1,))
    weight = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
    opt = ShardedOptimizer({"w": weight}, torch.optim.SGD, lr=0.1, momentum=0.9)
    (weight.to_local() * 2).sum().backward()
    opt.step()
    buffer = opt.state_dict()["state"]["w"]["momentum_buffer"]
    assert type(buffer).__name__ == "DTensor"
    assert (tuple(buffer.shape), tuple(buffer.placements)) == ((4, 2), (Shard(0),))


def test_factored_state_of_a_sharded_parameter_is_refused(world_of_one: Any) -> None:
    mesh = init_device_mesh("cpu", (1,))
    weight = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
    opt = ShardedOptimizer({"w": weight}, torch.optim.Adafactor, lr=0.1)
    (weight.to_local() * 2).sum().backward()
    opt.step()
    message = _error(opt.state_dict, TypeError)
    assert message.startswith("parameter 'w' (a DTensor): optimizer state 'row_var' has shape (4, 1)")
