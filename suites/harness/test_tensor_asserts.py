"""``DistributedTestCase.assertEqual``/``assertNotEqual`` mean what they meant under
``MultiProcessTestCase`` (a subclass of torch's ``common_utils.TestCase``) for tensors, and what
unittest's mean for everything else.

The assertions need no ranks, so they are called here on plain instances; the differential test
runs each case through torch's test case too and requires the same outcome.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing._internal.common_utils import TestCase as TorchTestCase

import harness


class Migrated(harness.DistributedTestCase):
    """A class moved from ``MultiProcessTestCase`` by changing its base only."""

    __test__ = False

    def runTest(self):  # noqa: N802 - unittest's name
        pass


class MixedIn(harness.DistributedTestCase, TorchTestCase):
    """docs/harness.md's way to get torch's ``assertEqual`` for every argument."""

    __test__ = False

    def runTest(self):  # noqa: N802 - unittest's name
        pass


class Torchs(TorchTestCase):
    __test__ = False

    def runTest(self):  # noqa: N802 - unittest's name
        pass


def outcome(case, actual, expected, **options):
    """``"equal"``, or the type of what ``assertEqual`` raised."""
    try:
        case.assertEqual(actual, expected, **options)
    except Exception as exc:  # noqa: BLE001 - the type is the outcome
        return type(exc).__name__
    return "equal"


def sparse(values, size=(2, 3)):
    indices = torch.tensor([[0, 1, 1], [2, 0, 2]])
    return torch.sparse_coo_tensor(indices, torch.tensor(values), size, check_invariants=True)


@pytest.fixture
def case():
    return Migrated()


def test_an_int64_tensor_does_not_equal_a_float32_one(case):
    with pytest.raises(AssertionError, match="dtype"):
        case.assertEqual(torch.tensor([1]), torch.tensor([1.0]))


def test_exact_dtype_false_compares_values_across_dtypes(case):
    case.assertEqual(torch.tensor([1]), torch.tensor([1.0]), exact_dtype=False)


def test_float32_values_within_torchs_default_tolerance_are_equal(case):
    case.assertEqual(torch.tensor([1.0]), torch.tensor([1.0000001]))


def test_float32_values_beyond_the_tolerance_are_not_equal_and_the_message_says_by_how_much(case):
    with pytest.raises(
        AssertionError, match=r"Tensor-likes are not close!(.|\n)*Greatest absolute difference"
    ):
        case.assertEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.1]))


def test_tensors_of_several_elements_compare_by_value(case):
    case.assertEqual(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 2"):
        case.assertEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]))


def test_tensors_of_different_shapes_are_not_equal(case):
    with pytest.raises(AssertionError, match="shape"):
        case.assertEqual(torch.ones(2), torch.ones(3))


def test_empty_tensors_compare(case):
    case.assertEqual(torch.empty(0), torch.empty(0))
    with pytest.raises(AssertionError, match="shape"):
        case.assertEqual(torch.empty(0), torch.empty(0, 2))


def test_sparse_tensors_compare_by_value(case):
    case.assertEqual(sparse([1.0, 2.0, 3.0]), sparse([1.0, 2.0, 3.0]))
    with pytest.raises(AssertionError, match="not close"):
        case.assertEqual(sparse([1.0, 2.0, 3.0]), sparse([1.0, 2.0, 4.0]))


def test_nan_equals_nan_as_in_torchs(case):
    case.assertEqual(torch.tensor([float("nan")]), torch.tensor([float("nan")]))
    with pytest.raises(AssertionError):
        case.assertEqual(torch.tensor([float("nan")]), torch.tensor([float("nan")]), equal_nan=False)


def test_a_one_element_tensor_compares_with_a_number(case):
    case.assertEqual(torch.tensor([3.0]), 3)
    with pytest.raises(AssertionError, match="Scalars are not close"):
        case.assertEqual(torch.tensor([3.0]), 4)


def test_a_tensor_compares_with_a_list_of_its_values(case):
    case.assertEqual(torch.tensor([1.0, 2.0]), [1.0, 2.0])


def test_tensors_inside_lists_and_dicts_compare_by_value_naming_the_item(case):
    case.assertEqual({"a": [torch.ones(2), 1]}, {"a": [torch.ones(2), 1]})
    with pytest.raises(AssertionError, match=r"The failure occurred for item \['a'\]\[0\]"):
        case.assertEqual({"a": [torch.ones(2), 1]}, {"a": [torch.zeros(2), 1]})


def test_rtol_and_atol_are_accepted_like_torchs(case):
    case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]), rtol=0.0, atol=0.2)
    with pytest.raises(AssertionError):
        case.assertEqual(torch.tensor([1.0]), torch.tensor([1.1]), rtol=0.0, atol=0.01)


def test_msg_follows_the_generated_message_as_in_torchs(case):
    with pytest.raises(AssertionError, match=r"Tensor-likes are not close!(.|\n)*\nthe all-reduced sum$"):
        case.assertEqual(torch.ones(2), torch.zeros(2), "the all-reduced sum")


def test_assert_not_equal_fails_on_equal_tensors_and_passes_on_different_ones(case):
    case.assertNotEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]))
    with pytest.raises(AssertionError):
        case.assertNotEqual(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]))


def test_non_tensor_arguments_keep_unittests_assert_equal(case):
    with pytest.raises(AssertionError, match=r"^1.0 != 1.0000001$"):
        case.assertEqual(1.0, 1.0000001)
    with pytest.raises(AssertionError, match=r"Lists differ"):
        case.assertEqual([1, 2], [1, 3])
    case.assertNotEqual("a", "b")


def test_mixing_torchs_test_case_in_uses_its_assert_equal_for_every_argument():
    MixedIn().assertEqual(1.0, 1.0000001)  # torch's tolerance, where unittest's is exact
    with pytest.raises(AssertionError, match="dtype"):
        MixedIn().assertEqual(torch.tensor([1]), torch.tensor([1.0]))


CASES = {
    "int64-vs-float32": (torch.tensor([1]), torch.tensor([1.0]), {}),
    "within-float32-tolerance": (torch.tensor([1.0]), torch.tensor([1.0000001]), {}),
    "beyond-float32-tolerance": (torch.tensor([1.0]), torch.tensor([1.001]), {}),
    "bfloat16-tolerance": (
        torch.tensor([1.0], dtype=torch.bfloat16),
        torch.tensor([1.0078125], dtype=torch.bfloat16),
        {},
    ),
    "float64-tolerance": (
        torch.tensor([1.0], dtype=torch.float64),
        torch.tensor([1.000001], dtype=torch.float64),
        {},
    ),
    "int-exact": (torch.tensor([2, 3]), torch.tensor([2, 4]), {}),
    "two-elements": (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0]), {}),
    "shapes-differ": (torch.ones(2, 3), torch.ones(3, 2), {}),
    "empty": (torch.empty(0, 3), torch.empty(0, 3), {}),
    "sparse-equal": (sparse([1.0, 2.0, 3.0]), sparse([1.0, 2.0, 3.0]), {}),
    "sparse-differ": (sparse([1.0, 2.0, 3.0]), sparse([1.0, 2.0, 5.0]), {}),
    "sparse-vs-dense": (sparse([1.0, 2.0, 3.0]), sparse([1.0, 2.0, 3.0]).to_dense(), {}),
    "nan": (torch.tensor([float("nan")]), torch.tensor([float("nan")]), {}),
    "nan-not-equal": (torch.tensor([float("nan")]), torch.tensor([float("nan")]), {"equal_nan": False}),
    "exact-dtype-off": (torch.tensor([1]), torch.tensor([1.0]), {"exact_dtype": False}),
    "atol-rtol": (torch.tensor([1.0]), torch.tensor([1.05]), {"atol": 0.1, "rtol": 0.0}),
    "only-atol": (torch.tensor([1.0]), torch.tensor([1.05]), {"atol": 0.1}),
    "tensor-vs-number": (torch.tensor([2.0]), 2, {}),
    "tensor-vs-other-number": (torch.tensor([2.0]), 3, {}),
    "many-elements-vs-number": (torch.tensor([2.0, 2.0]), 2, {}),
    "tensor-vs-list": (torch.tensor([1.0, 2.0]), [1.0, 2.0], {}),
    "list-of-tensors": ([torch.ones(2), torch.zeros(1)], [torch.ones(2), torch.zeros(1)], {}),
    "dict-of-tensors-differ": ({"w": torch.ones(2)}, {"w": torch.full((2,), 2.0)}, {}),
    "dict-keys-differ": ({"w": torch.ones(2)}, {"v": torch.ones(2)}, {}),
    "tensor-vs-array": (torch.tensor([1.0, 2.0], dtype=torch.float64), np.array([1.0, 2.0]), {}),
    "tensor-vs-none": (torch.ones(1), None, {}),
}


@pytest.mark.parametrize(("actual", "expected", "options"), CASES.values(), ids=CASES.keys())
def test_tensor_outcomes_match_torchs_test_case(actual, expected, options):
    assert outcome(Migrated(), actual, expected, **options) == outcome(Torchs(), actual, expected, **options)
