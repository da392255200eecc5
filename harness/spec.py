"""What a distributed test asks for: world size, backend, deadline, collective timeout.

Why one module: the marker, the fixture, the pool and torchrun mode all accept these numbers, and
each must reject bad input with the same clear ``ValueError`` (naming the argument and the fix)
instead of failing later inside a rank.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterable
from typing import Any

BACKENDS = ("gloo", "nccl")
MARKER = "distributed"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DistConfig:
    """One configuration a distributed test runs in."""

    world_size: int
    """Number of ranks, >= 1."""
    backend: str = "gloo"
    """``"gloo"`` (CPU) or ``"nccl"`` (one GPU per rank, ``cuda:rank``)."""
    deadline_s: float | None = None
    """Wall-clock limit of the whole test on the ranks; ``None`` takes the session default."""
    collective_timeout_s: float | None = None
    """Timeout of one collective; must be shorter than the deadline. ``None``: half the deadline."""

    def __post_init__(self) -> None:
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(
                f"world_size must be an int >= 1, got {self.world_size!r}; use e.g. world_size=2"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.deadline_s is not None and not self.deadline_s > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self.deadline_s!r}")
        if self.collective_timeout_s is not None:
            if not self.collective_timeout_s > 0:
                raise ValueError(f"collective_timeout must be > 0 seconds, got {self.collective_timeout_s!r}")
            if self.deadline_s is not None and self.collective_timeout_s >= self.deadline_s:
                raise ValueError(
                    f"collective_timeout ({self.collective_timeout_s}s) must be shorter than the deadline "
                    f"({self.deadline_s}s), so a stuck collective raises inside the rank first"
                )

    @property
    def id(self) -> str:
        """The pytest id of this configuration, e.g. ``gloo-2``."""
        return f"{self.backend}-{self.world_size}"

    def timeouts(self, default_deadline_s: float) -> tuple[float, float]:
        """``(deadline, collective timeout)`` with the defaults filled in."""
        deadline = self.deadline_s if self.deadline_s is not None else default_deadline_s
        collective = self.collective_timeout_s if self.collective_timeout_s is not None else deadline / 2
        if collective >= deadline:
            raise ValueError(
                f"collective_timeout ({collective}s) must be shorter than the deadline ({deadline}s)"
            )
        return deadline, collective


def _as_tuple(value: Any, name: str) -> tuple[Any, ...]:
    if isinstance(value, (str, int)):
        return (value,)
    if isinstance(value, Iterable):
        values = tuple(value)
        if not values:
            raise ValueError(f"{name} must not be empty; give one value or a list of values")
        return values
    return (value,)


def expand(
    world_size: int | Iterable[int] = 2,
    backend: str | Iterable[str] = "gloo",
    *,
    deadline: float | None = None,
    collective_timeout: float | None = None,
) -> list[DistConfig]:
    """Every (backend, world size) combination, validated; ``world_size=(2, 4)`` gives two."""
    return [
        DistConfig(world_size=ws, backend=be, deadline_s=deadline, collective_timeout_s=collective_timeout)
        for be, ws in itertools.product(_as_tuple(backend, "backend"), _as_tuple(world_size, "world_size"))
    ]


def distributed(
    world_size: int | Iterable[int] = 2,
    backend: str | Iterable[str] = "gloo",
    *,
    deadline: float | None = None,
    collective_timeout: float | None = None,
) -> Any:
    """Mark a test to run on every rank: ``@harness.distributed(world_size=(2, 4), backend="gloo")``.

    The arguments are checked here, at import, so a typo fails collection with a clear message.
    Equivalent to ``@pytest.mark.distributed(...)`` with the same keywords (the result is a pytest
    ``MarkDecorator``: it also works in ``pytestmark`` and ``pytest.param(marks=...)``), except that
    marking a lambda is a ``TypeError``: pytest would silently not collect it.
    """
    import pytest

    expand(world_size, backend, deadline=deadline, collective_timeout=collective_timeout)
    mark = getattr(pytest.mark, MARKER)(
        world_size=world_size, backend=backend, deadline=deadline, collective_timeout=collective_timeout
    )
    return _refusing_lambdas(mark)


@functools.cache
def _lambda_refusing_mark_type() -> type:
    """A ``MarkDecorator`` whose call refuses a lambda (made once, when pytest is imported).

    pytest applies a mark only to a named function or class; called with a lambda, a
    ``MarkDecorator`` returns another decorator with the lambda as a mark argument, so
    ``test_x = harness.distributed(...)(lambda rank: ...)`` is silently never collected.
    """
    from _pytest.mark.structures import MarkDecorator

    class DistributedMark(MarkDecorator):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            if len(args) == 1 and not kwargs and getattr(args[0], "__name__", None) == "<lambda>":
                raise TypeError(
                    "harness.distributed(...) cannot mark a lambda: pytest would not collect it, and the "
                    "ranks import a test by its name; define it with `def test_name(rank): ...` instead"
                )
            return super().__call__(*args, **kwargs)

    return DistributedMark


def _refusing_lambdas(mark: Any) -> Any:
    return _lambda_refusing_mark_type()(mark.mark, _ispytest=True)


def from_marker(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[DistConfig]:
    """The configurations of a ``distributed`` marker (positional world size allowed)."""
    if len(args) > 1:
        raise ValueError(
            f"the {MARKER} marker takes at most one positional argument (world_size), got {args!r}"
        )
    known = {"world_size", "backend", "deadline", "collective_timeout"}
    unknown = set(kwargs) - known
    if unknown:
        raise ValueError(f"unknown {MARKER} marker arguments {sorted(unknown)}; known: {sorted(known)}")
    merged = dict(kwargs)
    if args:
        merged["world_size"] = args[0]
    return expand(**merged)
