"""What a run keeps beside its engine on every row (rank side): the workload's LR schedulers and the
forward RNG policy.

Why apart from the engine and the restart: every row steps its schedulers after each update and
draws its forward's randomness by one policy, resume row or not; only a resume row saves, drops
and reloads them (``restart/resume.py``), and only it needs that machinery. The policy: a row's
forward RNG is seeded per ``(seed, rank, step)`` by the engine itself (``Engine.forward_rng``),
except on a resume row, whose forward RNG runs on from step to step (both sides), seeded once per
rank, as a real run's does (:class:`CarriedRng`): what a resume must then carry over.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from harness.parity.plan.config import ParityConfig
from harness.parity.ranks.sides import engines
from harness.parity.workload import registry


class CarriedRng:
    """torch's RNG for a resume row's forwards: seeded once per rank, then carried from step to step."""

    def __init__(self, seed: int, rank: int, device: torch.device, *, step: int = 0) -> None:
        self.device = device
        with registry.seeded(registry.forward_seed(seed, rank, step), device):
            self.state = self._get()

    def _get(self) -> list[torch.Tensor]:
        states = [torch.random.get_rng_state()]
        if self.device.type != "cpu":
            states.append(torch.get_device_module(self.device.type).get_rng_state(self.device))
        return states

    @contextlib.contextmanager
    def around(self, step: int) -> Iterator[None]:
        """The engine's forward RNG (``Engine.carried_rng``): the carried state inside, carried on
        afterwards."""
        saved = self._get()
        torch.random.set_rng_state(self.state[0])
        if self.device.type != "cpu":
            torch.get_device_module(self.device.type).set_rng_state(self.state[1], self.device)
        try:
            yield
        finally:
            self.state = self._get()
            torch.random.set_rng_state(saved[0])
            if self.device.type != "cpu":
                torch.get_device_module(self.device.type).set_rng_state(saved[1], self.device)


class LoopState:
    """One run's schedulers and forward RNG policy (module docstring), for the engine it is started
    with; a restart starts it again with the fresh engine (``restart/resume.py``)."""

    def __init__(self, config: ParityConfig, device: torch.device) -> None:
        self.config, self.device = config, device
        self.workload = registry.get(config.workload)
        self.schedulers: list[Any] = []
        """The workload's LR schedulers, one per optimizer (none without ``Workload.scheduler``)."""
        self.rng: CarriedRng | None = None
        """A resume row's carried forward RNG (``None``: the engine seeds each step's)."""

    def start(
        self, engine: engines.Engine, optimizers: list[torch.optim.Optimizer], *, seed: int | None = None
    ) -> None:
        """Schedulers over ``optimizers``; a resume row's carried RNG (both roles), seeded from
        ``seed`` (default: the configuration's; a restart's fresh process: another), handed to
        ``engine`` as its forward RNG."""
        if self.workload.scheduler is not None:
            self.schedulers = [self.workload.scheduler(opt) for opt in optimizers]
        if self.config.resume.at is not None:
            self.rng = CarriedRng(self.config.seed if seed is None else seed, engine.rank, self.device)
            engine.carried_rng = self.rng.around

    def after_update(self) -> None:
        """Step every scheduler once per optimizer step (after ``scaler.update()``)."""
        for scheduler in self.schedulers:
            scheduler.step()

    def drop_schedulers(self) -> None:
        """Let go of the schedulers (and through them the optimizers) of an engine being dropped."""
        self.schedulers = []
