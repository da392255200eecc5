"""How a failure is named in text: one line for an exception, the exception line of a recorded
traceback, every line of a rank's text prefixed ``[rank N]``.

Why its own module: the rank side writes these texts (``rank/execute``, the parity engine's
ranks) and the parity judge reads them back (``judge/compare``, ``judge/result``); both import
them from here, below either, so the judge never reaches into the rank side's executor for a
string helper.
"""

from __future__ import annotations

import re


def headline(exc: BaseException) -> str:
    """``Type: first line of the message``: how a failure is named in one line, as pytest's short
    summary names it (``NotImplementedError: Could not run 'aten::eq.Tensor' ...``).

    The type is qualified by its module unless it is a builtin, as in a traceback; the message line
    is its first non-blank one (a message that starts with a newline still says something).
    """
    cls = type(exc)
    name = (
        cls.__qualname__
        if cls.__module__ in ("builtins", "__main__")
        else f"{cls.__module__}.{cls.__qualname__}"
    )
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure
        message = "<exception str() failed>"
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return f"{name}: {first}" if first else name


_RANK_PREFIX = re.compile(r"^\[rank \d+\] ?")


def headline_of_text(text: str) -> str:
    """The exception line of a formatted traceback (each line maybe prefixed ``[rank N]``), prefix
    kept: the first unindented line after the last ``Traceback (most recent call last):``, which is
    ``Type: first line of the message`` however many lines the message has. For text recorded where
    the exception object is gone (a parity run's error); without a traceback header, the last line."""
    lines = text.strip().splitlines()
    bare = [_RANK_PREFIX.sub("", line) for line in lines]
    starts = [i for i, line in enumerate(bare) if line.startswith("Traceback (most recent call last)")]
    if starts:
        for line, stripped in zip(lines[starts[-1] + 1 :], bare[starts[-1] + 1 :], strict=True):
            if stripped and not stripped[0].isspace():
                return line
    return lines[-1] if lines else ""


def without_rank_prefix(line: str) -> str:
    """``line`` without the ``[rank N]`` a rank's text begins with."""
    return _RANK_PREFIX.sub("", line)


def prefix_lines(text: str, rank: int) -> str:
    """Prefix each line with ``[rank N]``."""
    return "\n".join(f"[rank {rank}] {line}" for line in text.rstrip("\n").splitlines())
