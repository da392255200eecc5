"""One world's rows on several groups of ranks at once (controller side).

Why: on the small models of a default matrix a row's time is mostly its collectives' latency, not
its arithmetic. On 2 cores with gloo over loopback, a collective costs 0.2 to 1 ms and a matrix
at world size 2 makes about 25,000 of them: each rank spends half its time waiting (measured with
cProfile), so two whole matrices run at once take 46 s where one alone takes 42 s. A second group
of ranks works while the first waits. Each group holds its own models, so the CLI asks for more
than one only where models are small (``jobs``).

Rows that share a reference or a float32 twin go to the same lane: a rank keeps a reference only
for the rows after it (``ranks/requests.py``), and a row in another lane would train it again.
The lanes take those families as they are free (:class:`Dealer`), not in shares fixed in advance.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks import requests

T = TypeVar("T")
Executor = Callable[..., list[list[Any]]]
"""``runner.Executor`` (named here too: a lower module of the door cannot import the runner)."""


class Stopped(Exception):
    """Another lane failed, or the run was interrupted: this lane stops before its next rank call."""


SMALL_JOBS = 2
"""Groups of ranks for small models: a third is no faster on 2 cores (measured: 26.6 s for the
matrix against 24 s)."""
SMALL_MODEL = 1_000_000
"""Parameters up to which a model's rows are latency-bound here: the embedded matrix's models and
tiny test configurations (a rank of the default matrix waits half its time; one of a 10M Llama
waits a quarter, and two groups would only compete for the cores and double the memory)."""


def jobs(options: argparse.Namespace) -> int:
    """How many groups of ranks the CLI runs at once: ``--jobs`` when given; else 2 on gloo when
    every model is small (the embedded matrix, or each ``--workload``'s model up to
    :data:`SMALL_MODEL` parameters: their rows wait on collectives more than they compute), and 1
    for a larger model (each group holds its own copy), compiled rows (compiling is arithmetic:
    a second group only competes for the cores) and NCCL (a GPU per rank)."""
    if options.jobs is not None:
        return int(options.jobs)
    if options.backend != "gloo" or options.compile is not None:
        return 1
    sizes = list(getattr(options, "parameters", {}).values())
    if options.workload and not sizes:  # sizes unknown: as for a large model
        return 1
    return for_sizes(sizes)


def for_sizes(sizes: list[int]) -> int:
    """Groups of ranks for models of these parameter counts on gloo: :data:`SMALL_JOBS` when all
    are small (:data:`SMALL_MODEL`), else 1 (``make bench`` asks it too)."""
    return SMALL_JOBS if all(size <= SMALL_MODEL for size in sizes) else 1


def families(configs: list[ParityConfig]) -> list[list[ParityConfig]]:
    """``configs`` in families, each in the given order, the families in the order of their first
    rows: a configuration is in the family of every other that shares its reference or its twin
    (and of theirs), so a rank that keeps a reference finds every row that reads it."""
    parent: dict[Any, Any] = {}

    def root(key: Any) -> Any:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    for config in configs:
        for shared in (config.reference_key(), requests.twin_key(config)):
            if shared is not None:
                parent[root(("row", config.id))] = root(("reference", shared))
    found: dict[Any, list[ParityConfig]] = {}
    for config in configs:
        found.setdefault(root(("row", config.id)), []).append(config)
    return list(found.values())


class Dealer:
    """One world's rows, handed to the lanes a few families at a time as each lane asks for more.

    Why not lanes fixed in advance: rows differ in cost (0.1 to 0.6 s on the default matrix: a
    resume row trains, saves and loads), and the ground truth's rank call takes one lane's first
    seconds, so two lanes of equal length finished 0.4 to 1.7 s apart, one core idle meanwhile.
    Dealt as asked, the largest families first, the lanes end within about one small family of
    each other. One lane takes every row at once, in the given order (as without lanes)."""

    def __init__(self, configs: list[ParityConfig], rows: int, *, lanes: int) -> None:
        if rows < 1:
            raise ValueError(f"rows must be >= 1 configuration a deal, got {rows}")
        self._order = {config.id: index for index, config in enumerate(configs)}
        self._families = families(configs)
        # the longest first, each to the lane free first: the last deals are short
        self._families.sort(key=len, reverse=True)
        self.lanes = max(1, min(lanes, len(self._families)))
        """The lanes worth running: at most one per family."""
        self._rows = rows if self.lanes > 1 else max(len(configs), 1)
        self._left = len(configs)
        self._lock = threading.Lock()

    def take(self) -> list[ParityConfig]:
        """The next whole families, in the given order (empty: nothing is left): at least ``rows``
        configurations, fewer as the end nears (a share of what is left per lane: a lane does not
        take a long last deal while the others have nothing left)."""
        with self._lock:
            wanted = self._rows  # one lane: every row at once
            if self.lanes > 1:  # a share of what is left per lane, at most ``rows``
                wanted = min(self._rows, -(-self._left // (2 * self.lanes)))
            taken: list[ParityConfig] = []
            while self._families and len(taken) < wanted:
                taken += self._families.pop(0)
            self._left -= len(taken)
        return sorted(taken, key=lambda config: self._order[config.id])


def run(lanes: list[T], executors: Sequence[Executor], work: Callable[[T, Executor], None]) -> None:
    """``work(lane, executor)`` for each lane (its rows, or the :class:`Dealer` every lane takes
    its rows from) with its own executor, all at once: the first in the
    calling thread (so an interruption there, as Ctrl-C, reaches the rank call in flight as it
    would without lanes), the others in daemon threads. When one lane raises, the others stop
    before their next rank call, and the first error is raised here once they have."""
    if len(executors) < len(lanes):
        raise ValueError(f"{len(lanes)} lanes need as many executors, got {len(executors)}")
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(execute: Executor) -> Executor:
        def call(*args: Any, **kwargs: Any) -> list[list[Any]]:
            if stop.is_set():
                raise Stopped("another lane of the run failed or was interrupted")
            return execute(*args, **kwargs)

        return call

    def lane(configs: T, execute: Executor) -> None:
        try:
            work(configs, guarded(execute))
        except Stopped:
            pass
        except BaseException as error:  # noqa: BLE001 - raised in the calling thread
            errors.append(error)
            stop.set()

    threads = [
        threading.Thread(target=lane, args=(configs, execute), name=f"parity-lane-{number}", daemon=True)
        for number, (configs, execute) in enumerate(
            zip(lanes[1:], executors[1 : len(lanes)], strict=True), start=1
        )
    ]
    try:
        for thread in threads:
            thread.start()
        if lanes:
            try:
                work(lanes[0], guarded(executors[0]))
            except Stopped:
                pass
        for thread in threads:
            thread.join()
    except BaseException:
        stop.set()  # the other lanes stop at their next rank call; the caller closes their ranks
        raise
    if errors:
        raise errors[0]
