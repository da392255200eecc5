"""GradScaler's own contract beyond the differential tests: validation, pickling, disabled mode."""

import copy
import math
import pickle

import pytest
import torch

from fixtures.training import Step, drive
from scaler import GradScaler, ScalerArgumentError, ScalerUsageError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"init_scale": 0.0}, "init_scale must be a finite number > 0, got 0.0"),
        ({"init_scale": -2.0}, "init_scale must be a finite number > 0, got -2.0"),
        ({"init_scale": math.inf}, "init_scale must be a finite number > 0, got inf"),
        ({"init_scale": math.nan}, "init_scale must be a finite number > 0, got nan"),
        ({"growth_factor": 0.9}, "growth_factor must be > 1.0, got 0.9"),
        ({"backoff_factor": 1.5}, r"backoff_factor must be in \(0, 1\), got 1.5"),
        ({"growth_interval": 0}, "growth_interval must be >= 1, got 0"),
    ],
)
def test_constructor_rejects_bad_values_naming_the_argument(kwargs, message):
    with pytest.raises(ScalerArgumentError, match=message):
        GradScaler("cpu", **kwargs)


def test_setters_validate_like_the_constructor():
    scaler = GradScaler("cpu")
    with pytest.raises(ScalerArgumentError, match="growth_factor must be > 1.0"):
        scaler.set_growth_factor(1.0)
    with pytest.raises(ScalerArgumentError, match="backoff_factor must be in"):
        scaler.set_backoff_factor(2.0)
    with pytest.raises(ScalerArgumentError, match="growth_interval must be >= 1"):
        scaler.set_growth_interval(-1)
    scaler.set_growth_factor(3.0)
    assert scaler.get_growth_factor() == 3.0


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_update_rejects_a_non_positive_or_non_finite_new_scale(bad):
    scaler = GradScaler("cpu")
    scaler.scale(torch.ones(()))
    with pytest.raises(ScalerArgumentError, match="new_scale must be a finite number > 0"):
        scaler.update(bad)
    with pytest.raises(ScalerArgumentError, match="new_scale must be a finite number > 0"):
        scaler.update(torch.tensor(bad))


@pytest.mark.parametrize(
    "bad",
    [torch.tensor([1.0, 2.0]), torch.tensor(2.0, requires_grad=True)],
    ids=["two_elements", "requires_grad"],
)
def test_update_rejects_a_tensor_new_scale_of_the_wrong_form(bad):
    scaler = GradScaler("cpu")
    scaler.scale(torch.ones(()))
    with pytest.raises(ValueError, match="new_scale should be a float or a 1-element"):
        scaler.update(bad)


def test_update_copies_a_tensor_new_scale():
    scaler = GradScaler("cpu")
    scaler.scale(torch.ones(()))
    value = torch.tensor(5.0)
    scaler.update(value)
    value.fill_(7.0)
    assert scaler.get_scale() == 5.0


def test_update_before_any_scale_is_a_usage_error_and_an_assertion_error_like_torch():
    scaler = GradScaler("cpu")
    with pytest.raises(ScalerUsageError, match="did not use scaler.scale"):
        scaler.update()
    with pytest.raises(AssertionError):
        scaler.update()


def test_pickle_round_trip_keeps_scale_tracker_and_factors():
    scaler = GradScaler("cpu", init_scale=64.0, growth_interval=3, backoff_factor=0.25)
    drive(scaler, [Step(), Step(overflow=True), Step()])
    restored = pickle.loads(pickle.dumps(scaler))
    assert (
        restored.state_dict()
        == scaler.state_dict()
        == {
            "scale": 16.0,
            "growth_factor": 2.0,
            "backoff_factor": 0.25,
            "growth_interval": 3,
            "_growth_tracker": 1,
        }
    )
    assert copy.deepcopy(scaler).state_dict() == scaler.state_dict()


def test_pickling_mid_iteration_is_refused():
    scaler = GradScaler("cpu")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(ScalerUsageError, match="may only be pickled at the beginning"):
        pickle.dumps(scaler)


def test_disabled_scaler_passes_everything_through():
    scaler = GradScaler("cpu", enabled=False)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(1, 2)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    before = model.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(before, model.weight)
    assert scaler.get_scale() == 1.0
    assert scaler.state_dict() == {}


def test_loading_an_empty_state_dict_is_refused():
    with pytest.raises(RuntimeError, match="saved from a disabled instance"):
        GradScaler("cpu").load_state_dict({})


def test_loading_a_state_dict_with_missing_keys_names_them():
    with pytest.raises(KeyError, match=r"\['_growth_tracker', 'growth_interval'\]"):
        GradScaler("cpu").load_state_dict({"scale": 2.0, "growth_factor": 2.0, "backoff_factor": 0.5})


def test_scale_accepts_nested_lists_and_tuples():
    scaler = GradScaler("cpu", init_scale=4.0)
    out = scaler.scale([torch.ones(2), (torch.ones(1), torch.full((1,), 2.0))])
    assert isinstance(out, list) and isinstance(out[1], tuple)
    assert out[0].tolist() == [4.0, 4.0] and out[1][1].tolist() == [8.0]


def test_scale_rejects_non_tensors():
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        GradScaler("cpu").scale([1.0])
