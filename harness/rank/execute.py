"""Run one case inside a rank and classify what happened (rank side; shared by pool and torchrun).

Why shared: the warm pool and ``python -m harness.frontends.torchrun`` must judge a test body the same way,
so the rules live once: a return is ``passed``; ``pytest.skip``/``unittest.SkipTest`` is
``skipped``; ``pytest.xfail`` is ``xfailed``; :class:`ReportedOutcome` is the status and text it
carries; anything else raised (``SystemExit`` included) is ``failed`` with its traceback. Every line
of a traceback starts with ``[rank N]`` so that interleaved reports stay attributable. A failure also
carries its *headline* (:func:`headline`), taken from the exception object here, where it is known:
the last line of a traceback is not the exception's line when its message spans lines.
"""

from __future__ import annotations

import importlib
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any

from harness.failure_text import headline, prefix_lines
from harness.protocol import Placeholder


class ReportedOutcome(Exception):
    """Raised by a case whose test framework already decided the outcome and wrote its text (a
    ``DistributedTestCase`` run by unittest): ``status`` is ``failed``, ``skipped`` or ``xfailed``,
    and ``text`` is used as it is (unittest's traceback, without the harness's frames)."""

    def __init__(self, status: str, text: str, headline: str = "") -> None:
        if status not in ("failed", "skipped", "xfailed"):
            raise ValueError(f"status must be 'failed', 'skipped' or 'xfailed', got {status!r}")
        super().__init__(text)
        self.status = status
        self.text = text
        self.headline = headline
        """For ``failed``: the headline of the exception behind it (:func:`headline`), or ``""``."""


def resolve(target: str) -> Callable[..., Any]:
    """Import ``module:qualname``; a class in the qualname is instantiated without arguments."""
    module_name, sep, qualname = target.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
        if isinstance(obj, type):
            obj = obj()
    if not callable(obj):
        raise TypeError(f"target {target!r} is not callable (got {type(obj).__name__})")
    return obj


def add_sys_path(entries: tuple[str, ...]) -> None:
    """Put the controller's import path entries this process lacks in front, keeping their order."""
    missing = [entry for entry in entries if entry not in sys.path]
    sys.path[:0] = missing


def _classify(exc: BaseException) -> str:
    """``skipped``/``xfailed``/``failed``; pytest's outcome classes are looked up only if loaded."""
    import unittest

    outcomes = sys.modules.get("_pytest.outcomes")
    if isinstance(exc, unittest.SkipTest) or (outcomes is not None and isinstance(exc, outcomes.Skipped)):
        return "skipped"
    if outcomes is not None and isinstance(exc, outcomes.XFailed):
        return "xfailed"
    return "failed"


def _format_failure(exc: BaseException, skip_frames: int) -> str:
    tb = exc.__traceback__
    for _ in range(skip_frames):  # drop the harness frames above the test body
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    if isinstance(exc, SystemExit):
        lines.insert(0, f"the test body called sys.exit({exc.code!r})\n")
    return "".join(lines)


def call_case(
    target: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, rank: int, world_size: int
) -> tuple[str, Any, str, str]:
    """Call ``target`` and return ``(status, payload, text, headline)`` with the status rules above
    (``headline`` is :func:`headline` of a failure's exception, ``""`` otherwise).

    ``payload`` is the return value pickled with the standard pickler (``None`` unless passed): the
    pickling both proves the value can reach the controller and makes tensors travel by value.
    Handing live tensors to a ``multiprocessing`` pipe instead would share each tensor's storage
    through a file descriptor, and a few thousand tensors exhaust the process's descriptors.
    """
    filled = {
        key: rank if value is Placeholder.RANK else world_size if value is Placeholder.WORLD_SIZE else value
        for key, value in kwargs.items()
    }
    try:
        func = resolve(target)
        value = func(*args, **filled)
        try:
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - any pickling error is the same user mistake
            raise TypeError(
                f"the return value of {target} cannot be sent to the controller ({exc}); "
                "return something picklable (plain data, tensors) or nothing"
            ) from exc
        return "passed", payload, "", ""
    except ReportedOutcome as outcome:
        text = prefix_lines(outcome.text, rank) if outcome.status == "failed" else outcome.text
        return outcome.status, None, text, outcome.headline
    except BaseException as exc:  # noqa: BLE001 - a rank reports everything, it never dies of it
        status = _classify(exc)
        if status != "failed":
            return status, None, str(getattr(exc, "msg", None) or exc), ""
        return "failed", None, prefix_lines(_format_failure(exc, skip_frames=1), rank), headline(exc)
