"""What a ``DistributedTestCase`` test asks for, read from its class: world size, backend and
deadlines, the GPUs it needs, its unittest skip, and the name by which the ranks import it.

Why apart from the class: the controller half (``testcase_controller``) reads these before any rank
runs, and the class's module hands each test to that half; with the readers here, neither of the
two imports the other for them.
"""

from __future__ import annotations

import sys
import unittest
from typing import Any

from harness.spec import DistConfig

MIN_GPUS_ATTR = "__shardscale_min_gpus__"
"""Where ``skip_if_lt_x_gpu`` leaves its count, on the method or the class."""


def min_gpus(test: unittest.TestCase) -> int:
    """How many CUDA GPUs ``test`` needs for its ``skip_if_lt_x_gpu`` (method or class); 0 if none."""
    method = getattr(type(test), test._testMethodName, None)
    return max(getattr(method, MIN_GPUS_ATTR, 0), getattr(type(test), MIN_GPUS_ATTR, 0))


def lt_x_gpu_reason(needed: int, have: int) -> str:
    """Why a ``skip_if_lt_x_gpu(needed)`` test does not run on a machine with ``have`` GPUs."""
    return f"skip_if_lt_x_gpu({needed}): this machine has {have} CUDA GPU{'' if have == 1 else 's'}"


def unittest_skip_reason(test: unittest.TestCase) -> str | None:
    """The reason of ``@unittest.skip``/``skipIf``/``skipUnless`` on the method or class, if skipped."""
    method = getattr(type(test), test._testMethodName, None)
    for obj in (type(test), method):
        if getattr(obj, "__unittest_skip__", False):
            return getattr(obj, "__unittest_skip_why__", "") or "skipped"
    return None


def case_config(test: Any) -> DistConfig:
    """The configuration ``test`` runs in, from its class attributes (or properties).

    Raises ``ValueError`` naming the class and the attribute, so a typo is an error of that test.
    """
    name = type(test).__name__
    try:
        return DistConfig(
            world_size=test.world_size,
            backend=test.backend,
            deadline_s=test.deadline,
            collective_timeout_s=test.collective_timeout,
        )
    except ValueError as exc:
        raise ValueError(
            f"invalid {name} (a harness.DistributedTestCase): {exc} "
            "(class attributes world_size, backend, deadline, collective_timeout)"
        ) from None


def locate(cls: type) -> tuple[str, str]:
    """``(module name, attribute path)`` by which the ranks import ``cls``.

    The attribute path is looked up by identity in the module, not taken from ``__qualname__``:
    ``parameterized_class`` makes classes (``TestX_0``, ``TestX_1``) that keep their base's
    qualified name. A class not reachable by name (defined in a function) is a ``ValueError``.
    """
    module_name = cls.__module__
    module = sys.modules.get(module_name)
    if module is not None:
        if getattr(module, cls.__name__, None) is cls:
            return module_name, cls.__name__
        for attr, value in vars(module).items():
            if value is cls:
                return module_name, attr
        obj: Any = module
        for part in cls.__qualname__.split("."):
            obj = getattr(obj, part, None)
        if obj is cls:
            return module_name, cls.__qualname__
    raise ValueError(
        f"{cls.__qualname__} must be reachable by name from its module {module_name!r}, because the "
        "ranks import it (module:Class); define it at module level, not inside a function"
    )
