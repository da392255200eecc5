"""``assertEqual``/``assertNotEqual`` that compare tensors the way torch's test case does.

Why: ``MultiProcessTestCase`` is a subclass of torch's ``common_utils.TestCase``, whose
``assertEqual`` compares tensors by value with per-dtype tolerances. A class migrated by changing
only its base to :class:`harness.DistributedTestCase` would otherwise get unittest's
``assertEqual``, under which an int64 ``[1]`` equals a float32 ``[1.0]``, ``[1.0]`` differs from
``[1.0000001]``, and a tensor of two elements, an empty or a sparse one raises instead of
comparing: the migrated suite would silently check something else.

The rules, as torch's ``TestCase.assertEqual`` has them (its keyword arguments are accepted too):

* an argument that is, or holds (in a list, tuple or dict), a tensor or a numpy array is compared
  with ``torch.testing.assert_close``: values within the dtype's default tolerances (or the given
  ``rtol``/``atol``), dtypes equal (``exact_dtype=False`` lifts it), NaN equal to NaN, any shape,
  empty and sparse tensors; the device and layout only with ``exact_device``/``exact_layout``;
* a tensor against a Python number: a one-element tensor is compared as a number, a sequence
  against a tensor is made a tensor of the other's dtype and device;
* numbers in such containers, or numbers with ``rtol``/``atol`` given: within float32's
  tolerances (exactly for ints), their types not checked;
* anything else: unittest's ``assertEqual``, unchanged.

When torch's ``common_utils.TestCase`` is mixed in after ``DistributedTestCase`` (the way to get
torch's comparison for every argument), its ``assertEqual`` is used, not this one. This module
imports torch only when a comparison involves a tensor, so the controller never imports it here.
"""

from __future__ import annotations

import functools
import sys
import unittest
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["TensorAssertions"]

_TORCH_OPTIONS = (
    "atol",
    "rtol",
    "equal_nan",
    "exact_dtype",
    "exact_device",
    "exact_layout",
    "exact_stride",
    "exact_is_coalesced",
)


def _is_array(value: Any) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)


def _holds_array(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is, or holds within lists, tuples and dicts, a tensor or array."""
    if _is_array(value):
        return True
    if depth > 8 or isinstance(value, (str, bytes)):
        return False
    if isinstance(value, Mapping):
        return any(_holds_array(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_array(v, depth + 1) for v in value)
    return False


@functools.cache
def _next_owner(cls: type, name: str) -> type:
    """The class after :class:`TensorAssertions` in ``cls``'s MRO that defines ``name``."""
    mro = cls.__mro__
    for owner in mro[mro.index(TensorAssertions) + 1 :]:
        if name in vars(owner):
            return owner
    return object


class TensorAssertions(unittest.TestCase):
    """A test case base whose ``assertEqual``/``assertNotEqual`` follow torch's test case on
    tensors (rules in the module docstring) and unittest's on everything else."""

    def assertEqual(  # noqa: N802 - unittest's name
        self,
        first: Any,
        second: Any,
        msg: str | Callable[[str], str] | None = None,
        **options: Any,
    ) -> None:
        """As torch's ``TestCase.assertEqual`` for tensors (``atol``, ``rtol``, ``equal_nan``,
        ``exact_dtype``, ``exact_device``, ``exact_layout``, ``exact_stride``,
        ``exact_is_coalesced``), as unittest's otherwise."""
        __tracebackhide__ = True
        if _next_owner(type(self), "assertEqual") is not unittest.TestCase:  # torch's mixed in
            super().assertEqual(first, second, msg, **options)
            return
        unknown = sorted(set(options) - set(_TORCH_OPTIONS))
        if unknown:
            raise TypeError(
                f"assertEqual() got unexpected keyword arguments {unknown}; torch's are {_TORCH_OPTIONS}"
            )
        if not (options.keys() & {"atol", "rtol"}) and not (_holds_array(first) or _holds_array(second)):
            super().assertEqual(first, second, msg)
            return
        from harness.frontends import tensor_compare

        message = msg
        if isinstance(msg, str) and self.longMessage:
            message = lambda generated: f"{generated}\n{msg}"  # noqa: E731 - unittest's longMessage
        tensor_compare.assert_equal(first, second, msg=message, fallback=super().assertEqual, **options)

    def assertNotEqual(  # noqa: N802 - unittest's name
        self,
        first: Any,
        second: Any,
        msg: str | None = None,
        **options: Any,
    ) -> None:
        """Fails where :meth:`assertEqual` passes, with the same rules."""
        __tracebackhide__ = True
        if _next_owner(type(self), "assertNotEqual") is not unittest.TestCase:
            super().assertNotEqual(first, second, msg, **options)
            return
        if not options and not (_holds_array(first) or _holds_array(second)):
            super().assertNotEqual(first, second, msg)
            return
        with self.assertRaises(AssertionError, msg=msg):
            self.assertEqual(first, second, msg, **options)
