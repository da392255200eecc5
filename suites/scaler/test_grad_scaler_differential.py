"""GradScaler matches torch.amp.GradScaler: same inputs, bitwise-same trajectory.

Each test drives torch's scaler and ours through the same planned steps (fixtures.training) and
compares scale, growth tracker, skip decisions, unscaled grads and parameters at every step.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.training import Step, assert_same_trajectory, batch, drive, make_model
from scaler import GradScaler

CLEAN, OVERFLOW = Step(), Step(overflow=True)


def both(plan, *, scaler_kwargs=None, **drive_kwargs):
    scaler_kwargs = scaler_kwargs or {}
    theirs = drive(torch.amp.GradScaler("cpu", **scaler_kwargs), plan, **drive_kwargs)
    ours = drive(GradScaler("cpu", **scaler_kwargs), plan, **drive_kwargs)
    return theirs, ours


def test_growth_exactly_at_the_interval_matches_torch():
    theirs, ours = both([CLEAN] * 7, scaler_kwargs={"init_scale": 1024.0, "growth_interval": 3})
    assert_same_trajectory(theirs, ours)
    assert ours.scales == [1024.0, 1024.0, 2048.0, 2048.0, 2048.0, 4096.0, 4096.0]
    assert ours.trackers == [1, 2, 0, 1, 2, 0, 1]


def test_backoff_after_overflow_matches_torch_and_skips_the_step():
    plan = [CLEAN, OVERFLOW, CLEAN, OVERFLOW, OVERFLOW, CLEAN]
    theirs, ours = both(plan, scaler_kwargs={"init_scale": 1024.0, "growth_interval": 2})
    assert_same_trajectory(theirs, ours)
    assert ours.skipped == [False, True, False, True, True, False]
    assert ours.scales == [1024.0, 512.0, 512.0, 256.0, 128.0, 128.0]


def test_growth_that_would_overflow_float32_matches_torch():
    # The scaled loss stays finite (loss_factor), so every step is clean and the rule tries to grow.
    plan = [CLEAN] * 3
    theirs, ours = both(
        plan, scaler_kwargs={"init_scale": 2.0**127, "growth_interval": 1}, loss_factor=2.0**-126
    )
    assert_same_trajectory(theirs, ours)
    assert ours.scales == [2.0**127] * 3


@pytest.mark.parametrize("kind", ["float", "tensor"])
def test_update_with_new_scale_matches_torch(kind):
    value = 300.0 if kind == "float" else torch.tensor(300.0)
    plan = [CLEAN, Step(new_scale=value), CLEAN, CLEAN]
    theirs, ours = both(plan, scaler_kwargs={"init_scale": 1024.0, "growth_interval": 2})
    assert_same_trajectory(theirs, ours)
    # update(new_scale) leaves the growth tracker alone: the streak from step 0 continues.
    assert ours.scales[1:] == [300.0, 600.0, 600.0]
    assert ours.trackers == [1, 1, 0, 1]


def test_unscale_first_with_gradient_clipping_matches_torch():
    plan = [CLEAN, OVERFLOW, CLEAN, CLEAN]
    theirs, ours = both(plan, scaler_kwargs={"growth_interval": 2}, unscale_first=True)
    assert_same_trajectory(theirs, ours)


@pytest.mark.parametrize("optimizer", ["adam", "adam_fused", "adamw_fused", "sgd_fused"])
def test_other_optimizers_match_torch(optimizer):
    plan = [CLEAN, OVERFLOW, CLEAN, CLEAN, OVERFLOW]
    theirs, ours = both(plan, scaler_kwargs={"growth_interval": 2}, optimizer=optimizer)
    assert_same_trajectory(theirs, ours)
    assert ours.skipped == [False, True, False, False, True]


def test_fused_optimizer_after_unscale_matches_torch():
    plan = [CLEAN, OVERFLOW, CLEAN]
    theirs, ours = both(
        plan, scaler_kwargs={"growth_interval": 2}, optimizer="adam_fused", unscale_first=True
    )
    assert_same_trajectory(theirs, ours)


def test_state_dict_has_torchs_keys_and_values():
    theirs, ours = torch.amp.GradScaler("cpu", growth_interval=3), GradScaler("cpu", growth_interval=3)
    plan = [CLEAN, OVERFLOW, CLEAN, CLEAN]
    drive(theirs, plan)
    drive(ours, plan)
    assert ours.state_dict() == theirs.state_dict()


@pytest.mark.parametrize("direction", ["torch_to_ours", "ours_to_torch"])
def test_state_dict_moves_between_torch_and_ours_mid_training(direction):
    plan = [CLEAN, CLEAN, OVERFLOW, CLEAN, CLEAN, CLEAN]
    source = (
        torch.amp.GradScaler("cpu", growth_interval=3)
        if direction == "torch_to_ours"
        else GradScaler("cpu", growth_interval=3)
    )
    drive(source, plan[:3])
    target = GradScaler("cpu") if direction == "torch_to_ours" else torch.amp.GradScaler("cpu")
    target.load_state_dict(source.state_dict())
    reference = torch.amp.GradScaler("cpu", growth_interval=3)
    drive(reference, plan[:3])
    assert target.state_dict() == reference.state_dict()
    assert_same_trajectory(drive(reference, plan[3:]), drive(target, plan[3:]))


def test_load_state_dict_into_a_scaler_that_has_stepped_restores_scale_and_tracker_like_torch():
    saved = {
        "scale": 256.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "_growth_tracker": 2,
    }
    runs = []
    for cls in (torch.amp.GradScaler, GradScaler):
        scaler = cls("cpu", init_scale=1024.0, growth_interval=5)
        drive(scaler, [CLEAN, OVERFLOW, CLEAN])  # the scale and tracker tensors exist and have moved
        scaler.load_state_dict(saved)
        assert (scaler.get_scale(), scaler._get_growth_tracker()) == (256.0, 2)
        runs.append(drive(scaler, [CLEAN, CLEAN]))
    assert_same_trajectory(*runs)
    assert runs[1].scales == [512.0, 512.0]  # the restored tracker completes the interval at once


def test_misuse_errors_have_torchs_types_and_messages():
    def misuse(scaler, what):
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        if what == "unscale_twice":
            scaler.unscale_(opt)
            scaler.unscale_(opt)
        elif what == "unscale_after_step":
            scaler.step(opt)
            scaler.unscale_(opt)
        elif what == "step_twice":
            scaler.step(opt)
            scaler.step(opt)
        elif what == "closure":
            scaler.step(opt, closure=lambda: 0.0)

    for what in ("unscale_twice", "unscale_after_step", "step_twice", "closure"):
        with pytest.raises(RuntimeError) as theirs:
            misuse(torch.amp.GradScaler("cpu"), what)
        with pytest.raises(RuntimeError) as ours:
            misuse(GradScaler("cpu"), what)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value)), what


def test_fp16_grads_are_refused_with_torchs_message():
    for scaler in (torch.amp.GradScaler("cpu"), GradScaler("cpu")):
        param = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
        opt = torch.optim.SGD([param], lr=0.1)
        scaler.scale(torch.ones(()))
        param.grad = torch.ones(2, dtype=torch.float16)
        with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
            scaler.unscale_(opt)


def test_sparse_grads_unscale_like_torch():
    results = []
    for scaler in (torch.amp.GradScaler("cpu", init_scale=4.0), GradScaler("cpu", init_scale=4.0)):
        emb = torch.nn.Embedding(6, 3, sparse=True)
        with torch.no_grad():
            emb.weight.fill_(1.0)
        opt = torch.optim.SGD(emb.parameters(), lr=0.5)
        scaler.scale(emb(torch.tensor([1, 1, 4])).sum()).backward()
        scaler.unscale_(opt)
        results.append(emb.weight.grad.to_dense())
        scaler.step(opt)
        scaler.update()
    assert torch.equal(results[0], results[1])
    assert results[1][1].tolist() == [2.0, 2.0, 2.0]


def test_default_device_on_a_cpu_machine_warns_and_disables_like_torch():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the default device is usable")
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling."):
        theirs = torch.amp.GradScaler()
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling."):
        ours = GradScaler()
    assert theirs.is_enabled() is ours.is_enabled() is False


steps = st.lists(st.booleans(), min_size=1, max_size=14)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    overflows=steps,
    growth_interval=st.integers(min_value=1, max_value=5),
    growth_factor=st.floats(min_value=1.01, max_value=8.0, allow_nan=False),
    backoff_factor=st.floats(min_value=0.01, max_value=0.99, allow_nan=False),
    init_scale=st.sampled_from([1.0, 3.0, 2.0**10, 2.0**16, 12345.678]),
)
def test_random_step_sequences_match_torch(
    overflows, growth_interval, growth_factor, backoff_factor, init_scale
):
    plan = [Step(overflow=o) for o in overflows]
    kwargs = {
        "init_scale": init_scale,
        "growth_interval": growth_interval,
        "growth_factor": growth_factor,
        "backoff_factor": backoff_factor,
    }
    theirs, ours = both(plan, scaler_kwargs=kwargs)
    assert_same_trajectory(theirs, ours)


def _mixed_params():
    """fp32 and fp64 params (two buckets), one without a grad, one grad holding inf when asked."""
    dtypes = (torch.float32, torch.float64, torch.float32, torch.float64)
    params = [torch.nn.Parameter(torch.ones(3, dtype=dtype)) for dtype in dtypes]
    for index, param in enumerate(params[:3]):  # the last one has no grad
        param.grad = torch.full_like(param, 8.0 * (index + 1))
    return params


@pytest.mark.parametrize("overflow_in", [None, "float32", "float64"])
def test_grads_of_several_dtypes_and_params_without_grads_match_torch(overflow_in):
    results = []
    for scaler in (torch.amp.GradScaler("cpu", init_scale=4.0), GradScaler("cpu", init_scale=4.0)):
        params = _mixed_params()
        for param in params[:3]:
            if str(param.dtype) == f"torch.{overflow_in}":
                param.grad[0] = float("inf")
        opt = torch.optim.SGD(params, lr=1.0)
        scaler.scale(torch.ones(()))
        scaler.unscale_(opt)
        flags = {device: flag.item() for device, flag in scaler._found_inf_per_device(opt).items()}
        results.append(([p.grad for p in params], flags))
    (grads_theirs, flags_theirs), (grads_ours, flags_ours) = results
    assert flags_ours == flags_theirs
    assert grads_ours[3] is None
    for theirs, ours in zip(grads_theirs[:3], grads_ours[:3], strict=True):
        assert torch.equal(theirs.nan_to_num(), ours.nan_to_num()) and theirs.dtype == ours.dtype


def test_an_optimizer_without_any_grad_is_refused_at_step_like_torch():
    errors = []
    for scaler in (torch.amp.GradScaler("cpu"), GradScaler("cpu")):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1.0)
        scaler.scale(torch.ones(()))
        with pytest.raises(AssertionError) as raised:
            scaler.step(opt)
        errors.append(str(raised.value))
    assert errors[0] == errors[1] == "No inf checks were recorded for this optimizer."


def test_grads_made_with_create_graph_unscale_like_torch():
    """Grads that require grad (double backward) are unscaled without recording autograd history."""
    grads = []
    for scaler in (torch.amp.GradScaler("cpu", init_scale=4.0), GradScaler("cpu", init_scale=4.0)):
        model = make_model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler.scale(model(batch(0)).pow(2).mean()).backward(create_graph=True)
        scaler.unscale_(opt)
        grads.append(
            [
                (p.grad.detach().clone(), p.grad.requires_grad, type(p.grad.grad_fn))
                for p in model.parameters()
            ]
        )
    for (g_theirs, rg_theirs, fn_theirs), (g_ours, rg_ours, fn_ours) in zip(*grads, strict=True):
        assert torch.equal(g_theirs, g_ours) and rg_theirs == rg_ours and fn_theirs is fn_ours


def test_an_inf_in_a_later_param_group_is_found_like_torch():
    skipped = []
    for scaler in (torch.amp.GradScaler("cpu"), GradScaler("cpu")):
        model = make_model(0)
        opt = torch.optim.SGD(
            [{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": 0.5}], lr=0.1
        )
        scaler.scale(model(batch(0)).pow(2).mean()).backward()
        model[2].bias.grad[0] = float("inf")
        before = model[2].weight.detach().clone()
        scaler.step(opt)
        scaler.update()
        skipped.append((torch.equal(before, model[2].weight), scaler.get_scale()))
    assert skipped[0] == skipped[1] == (True, 2.0**15)


@pytest.mark.parametrize("unscale_first", [False, True], ids=["fused_unscale", "unscale_first"])
def test_a_fused_optimizers_own_grad_scale_is_combined_like_torch(unscale_first):
    """torch multiplies a ``grad_scale`` the optimizer already holds into the one it hands over."""
    params = []
    for scaler in (torch.amp.GradScaler("cpu", init_scale=4.0), GradScaler("cpu", init_scale=4.0)):
        weight = torch.nn.Parameter(torch.ones(3))
        opt = torch.optim.SGD([weight], lr=1.0, fused=True)
        scaler.scale(torch.ones(()))
        weight.grad = torch.full((3,), 8.0)
        if unscale_first:
            scaler.unscale_(opt)
        opt.grad_scale = torch.full((), 2.0)
        scaler.step(opt)
        scaler.update()
        params.append(weight.detach().clone())
    assert torch.equal(params[0], params[1])
