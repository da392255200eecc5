"""The comparison behind ``DistributedTestCase.assertEqual`` on tensors (imports torch).

Why apart from :mod:`harness.frontends.tensor_asserts`: that module is imported by the controller, which
never needs torch for it; this one runs only when a comparison involves a tensor or an array. The
values are compared by ``torch.testing.assert_close`` (torch's per-dtype tolerances, dtype, shape,
sparse and empty tensors); what torch's test case adds around it is done here: numbers against
one-element tensors, sequences against tensors, containers walked element by element, NaN equal
to NaN, device and layout not checked unless asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["assert_equal"]

_NUMBERS = (bool, int, float, complex)
_FLOAT32_TOLERANCES = (1.3e-6, 1e-5)
"""float32's (rtol, atol) in ``torch.testing.assert_close``: what torch's test case allows
between Python floats or complex numbers; ints (and bools) compare exactly."""


def assert_equal(
    actual: Any,
    expected: Any,
    *,
    msg: str | Callable[[str], str] | None,
    fallback: Callable[[Any, Any], None],
    atol: float | None = None,
    rtol: float | None = None,
    equal_nan: bool = True,
    exact_dtype: bool = True,
    exact_device: bool = False,
    exact_layout: bool = False,
    exact_stride: bool = False,
    exact_is_coalesced: bool = False,
) -> None:
    """Raise ``AssertionError`` unless ``actual`` equals ``expected`` by torch's test case's rules.

    ``fallback`` compares what is neither a tensor, an array nor a number (unittest's
    ``assertEqual``). ``msg`` replaces the generated message, or (a callable) rewrites it.
    ``exact_is_coalesced`` is accepted and, as by torch's own test case, not checked.
    """
    __tracebackhide__ = True
    del exact_is_coalesced
    if isinstance(actual, torch.Tensor) and _is_sequence(expected):
        expected = torch.as_tensor(expected, dtype=actual.dtype, device=actual.device)
    elif _is_sequence(actual) and isinstance(expected, torch.Tensor):
        actual = torch.as_tensor(actual, dtype=expected.dtype, device=expected.device)
    options = {
        "rtol": rtol,
        "atol": atol,
        "equal_nan": equal_nan,
        "check_device": exact_device,
        "check_dtype": exact_dtype,
        "check_layout": exact_layout,
        "check_stride": exact_stride,
    }
    try:
        _compare(actual, expected, "", options, fallback)
    except AssertionError as exc:
        generated = str(exc)
        raise AssertionError(msg(generated) if callable(msg) else generated if msg is None else msg) from None


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _as_tensor(value: Any) -> Any:
    """A numpy array becomes a tensor (torch's test case compares the two kinds freely)."""
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def _is_array(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    return type(value).__module__ == "numpy" and type(value).__name__ == "ndarray"


def _compare(actual: Any, expected: Any, path: str, options: dict[str, Any], fallback: Callable) -> None:
    try:
        _compare_here(actual, expected, path, options, fallback)
    except AssertionError as exc:
        if not path or "The failure occurred for item" in str(exc):
            raise
        raise AssertionError(f"{exc}\n\nThe failure occurred for item {path}") from None


def _compare_here(actual: Any, expected: Any, path: str, options: dict[str, Any], fallback: Callable) -> None:
    if _is_array(actual) and _is_array(expected):
        torch.testing.assert_close(_as_tensor(actual), _as_tensor(expected), **options)
    elif isinstance(actual, _NUMBERS) or isinstance(expected, _NUMBERS):
        if not all(isinstance(v, _NUMBERS) or _is_array(v) for v in (actual, expected)):
            fallback(actual, expected)
            return
        _compare_numbers(_number(actual), _number(expected), options)
    elif isinstance(actual, Mapping) and isinstance(expected, Mapping):
        if set(actual) != set(expected):
            raise AssertionError(
                f"The keys of the mappings do not match:\nMissing keys in the actual mapping: "
                f"{sorted(map(repr, set(expected) - set(actual)))}\nExtra keys in the actual mapping: "
                f"{sorted(map(repr, set(actual) - set(expected)))}"
            )
        for key in actual:
            _compare(actual[key], expected[key], f"{path}[{key!r}]", options, fallback)
    elif _is_sequence(actual) and _is_sequence(expected):
        if len(actual) != len(expected):
            raise AssertionError(f"The length of the sequences mismatch: {len(actual)} != {len(expected)}")
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _compare(a, e, f"{path}[{index}]", options, fallback)
    elif _is_array(actual) or _is_array(expected):
        raise AssertionError(
            f"{type(actual).__name__} is not comparable with {type(expected).__name__}: "
            f"{actual!r} != {expected!r}"
        )
    else:
        fallback(actual, expected)


def _number(value: Any) -> int | float | complex:
    """A number, or the one element of a tensor or array (compared as a number, as torch's does)."""
    if _is_array(value):
        tensor = _as_tensor(value)
        if tensor.numel() != 1:
            raise ValueError(
                "Only single element tensor-likes can be compared against a number. "
                f"Got {tensor.numel()} elements instead."
            )
        value = tensor.item()
    return int(value) if isinstance(value, bool) else value


def _compare_numbers(actual: Any, expected: Any, options: dict[str, Any]) -> None:
    rtol, atol = options["rtol"], options["atol"]
    if rtol is None and atol is None:
        exact = isinstance(actual, int) and isinstance(expected, int)
        rtol, atol = (0.0, 0.0) if exact else _FLOAT32_TOLERANCES
    torch.testing.assert_close(
        actual, expected, rtol=rtol, atol=atol, equal_nan=options["equal_nan"], check_dtype=False
    )
