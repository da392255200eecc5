"""A run that stops, saves, comes back and trains on (rank side): the resume row's candidate.

Why: resume bugs show up as a loss spike hours after a restart, and a plain unit test has none of
what it takes (a save, a fresh model, a load into sharded state). At step ``config.resume.at`` the
candidate saves a checkpoint (``resume_store.py``: the row's method), every rank drops its engine,
optimizer, scaler and scheduler, builds a fresh engine whose weights are new random values (so a
load that does nothing shows; in another layout when ``config.resume.layout`` says so), loads,
and trains the remaining steps. The reference trains
straight through, and the two are compared step by step as any row.

Beside the checkpoint the loop keeps what a training script keeps itself, one file per rank: the
step count (the data position: batches are drawn per ``(rank, step)``), the forward RNG state and
the LR schedulers' states. A resume row's forward RNG runs on from step to step (both sides),
seeded once per rank, as a real run's does; other rows reseed it per step. Both are every run's
(``sides/loop_state.LoopState``); only the runs that restart or hand over (:func:`restarts`) build
a :class:`Restart`, which saves and restores them.

What the report names when a resume row fails comes from two audits recorded on the resumed step:
``restored`` (right after the load, which state differs from what was saved: weights, optimizer
moments, optimizer step counts, scaler, RNG, schedulers; each rank its own shards) and
``weights_at_forward`` (whether the weights equalled the saved ones when the resumed step's
forward began). A save or load that raises, a folder that cannot be written and a save that
writes nothing are errors naming the rank and the function; the ranks agree through the case's
store after each phase, so a rank whose load failed never leaves its peers in a collective.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from harness.parity.plan.config import ParityConfig
from harness.parity.plan.config import resume as resume_part
from harness.parity.ranks.restart import DIR_ENV, reshard, resume_store
from harness.parity.ranks.restart.resume_state import audit, scramble, snapshot
from harness.parity.ranks.restart.resume_state import moved as moved_weights
from harness.parity.ranks.sides import checkpoint, engines, roles
from harness.parity.ranks.sides.loop_state import CarriedRng, LoopState
from harness.parity.ranks.wire import RankStep, ResumeAudit
from harness.rank import context
from harness.rank.subtests import all_ranks

_FRESH_SEED = 7919
"""Added to the configuration's seed for the fresh model's weights: new values, not the saved ones."""


class ResumeError(RuntimeError):
    """A resume phase failed; the message names the rank and the function."""


def restarts(config: ParityConfig, role: str, half: reshard.Half | None = None) -> bool:
    """Whether ``role``'s run of ``config`` needs the resume machinery (:class:`Restart`): a resume
    row's candidate, or either side of a resharded row's half. Every other run, a resume row's
    reference included, needs only what every row has (``sides/loop_state.LoopState``)."""
    return half is not None or (role == "candidate" and config.resume.at is not None)


class Restart:
    """A resume row's restart, beside the run's :class:`~harness.parity.ranks.sides.loop_state.LoopState`
    (``loop``): the save, the drop, the fresh engine and the load, or a resharded row's hand-over
    between its halves, and the audits of the resumed step. Built only where :func:`restarts`."""

    def __init__(
        self,
        config: ParityConfig,
        role: str,
        device: torch.device,
        loop: LoopState,
        half: reshard.Half | None = None,
    ) -> None:
        self.config, self.role, self.device, self.loop, self.half = config, role, device, loop, half
        self.pending: list[Callable[[], None]] = []
        """Work for the end of the resumed step (the checkpoint folder's removal)."""
        self._saved: dict[str, Any] | None = None
        self._restored: dict[str, list[str]] | None = None
        self._at_forward: bool | None = None
        self._audit: ResumeAudit | None = None
        self._base: str | None = None
        """The checkpoint's folder while it exists (removed after the resumed step, or by :meth:`close`)."""
        self._phase = 0

    def restarts_at(self, step: int) -> bool:
        """Whether the candidate saves and restarts before ``step`` (the same on every rank; a
        resharded row's halves save and load in :meth:`depart` and :meth:`arrive` instead)."""
        return self.half is None and self.role == "candidate" and step == self.config.resume.at

    def arrives(self) -> bool:
        """Whether this run is a resharded row's second half: it begins with :meth:`arrive`."""
        return self.half is not None and self.half.part == 2

    def departs(self) -> bool:
        """Whether this run is a resharded row's first half: it ends with :meth:`depart`."""
        return self.half is not None and self.half.part == 1

    # -- the restart --------------------------------------------------------------------------------
    def restart(
        self,
        step: int,
        engine: engines.Engine,
        optimizers: list[torch.optim.Optimizer],
        scaler: Any,
        new_scaler: Callable[[], Any],
    ) -> Any:
        """Save, drop everything, build a fresh engine (and a ``new_scaler()``), load;
        ``(engine, groups, optimizers, scaler)``."""
        store = self._store()
        base = _new_folder()
        self._base = base
        self._save(store, base, step, engine, optimizers, scaler)
        del engine, optimizers, scaler
        return self._come_back(store, base, step, new_scaler)

    def depart(
        self, step: int, engine: engines.Engine, optimizers: list[torch.optim.Optimizer], scaler: Any
    ) -> None:
        """The end of a resharded row's first half: the candidate saves through its method, the
        reference hands its state over (``reshard.py``)."""
        assert self.half is not None
        if self.role == "candidate":
            self._save(self._store(), self.half.folder, step, engine, optimizers, scaler)
            return
        (optimizer,) = optimizers
        folder = self.half.folder
        self._phase_ok(
            "hand over",
            lambda: reshard.hand_over(folder, engine, optimizer, scaler, self.loop),
            "the reference's hand-over to the other world size",
        )

    def arrive(self, step: int, new_scaler: Callable[[], Any]) -> Any:
        """The start of a resharded row's second half, at this world size: the candidate builds a
        fresh engine and loads, the reference takes over the state its first half handed over;
        ``(engine, groups, optimizers, scaler)``."""
        assert self.half is not None
        if self.role == "candidate":
            return self._come_back(self._store(), self.half.folder, step, new_scaler)
        engine = roles.build(self.config, self.role, self.device)
        checkpoint.install(engine, self.config, self.role)
        groups = engine.param_groups(1)
        optimizers = [engine.make_optimizer(group) for group in groups]
        scaler = new_scaler()
        self.loop.start(engine, optimizers)
        half = self.half

        def take_over() -> None:
            own = reshard.take_over(half.folder, engine, optimizers[0], scaler, half.saved_world_size)
            self._restore_loop(own["rng"], own["schedulers"], step)

        self._phase_ok("take over", take_over, "the reference's take-over at this world size")
        return engine, groups, optimizers, scaler

    def _store(self) -> Any:
        return resume_store.method(self.config.resume.method or "dcp", self.config.workload)

    def _save(
        self,
        store: Any,
        base: str,
        step: int,
        engine: engines.Engine,
        optimizers: list[torch.optim.Optimizer],
        scaler: Any,
    ) -> None:
        folder = os.path.join(base, "checkpoint")
        self._phase_ok("folder", lambda: _writable(folder), folder)
        (optimizer,) = optimizers
        saving = resume_store.function(store, "save")
        self._saved = snapshot(engine, optimizer, scaler, self.loop)
        if self.config.resume.layout is not None:  # the shards move: compare whole tensors (collective)
            self._saved["full_weights"] = engine.full_after_step([optimizer])[0]
        if self.half is not None:  # another world size: the second half audits whole tensors
            saved = self._saved
            self._phase_ok(
                "audit", lambda: reshard.save_audit(base, engine, optimizer, saved), "the resume's audit"
            )
        self._phase_ok(
            "save", functools.partial(store.save, folder, engine.wrapped, optimizer, scaler), saving
        )
        self._phase_ok("write", functools.partial(_wrote_something, folder, saving), saving)
        self._phase_ok("save loop state", lambda: self._save_loop(base, step), "the loop's own state")

    def _come_back(self, store: Any, base: str, step: int, new_scaler: Callable[[], Any]) -> Any:
        folder = os.path.join(base, "checkpoint")
        self.loop.drop_schedulers()
        gc.collect()
        layout = resume_part.into(self.config)
        engine = roles.build(layout, self.role, self.device)
        checkpoint.install(engine, layout, self.role)
        scramble(engine, self.config.seed + _FRESH_SEED)
        groups = engine.param_groups(1)
        optimizers = [engine.make_optimizer(group) for group in groups]
        scaler = new_scaler()
        self.loop.start(engine, optimizers, seed=self.config.seed + _FRESH_SEED)  # as a new process has
        self._load(base, folder, store, engine, optimizers[0], scaler, step)
        self.pending.append(self.close)
        return engine, groups, optimizers, scaler

    def _load(
        self,
        base: str,
        folder: str,
        store: Any,
        engine: engines.Engine,
        optimizer: Any,
        scaler: Any,
        step: int,
    ) -> None:
        self._phase_ok(
            "load",
            lambda: store.load(folder, engine.wrapped, optimizer, scaler),
            resume_store.function(store, "load"),
        )
        self._phase_ok("load loop state", lambda: self._load_loop(base, step), "the loop's own state")
        now = snapshot(engine, optimizer, scaler, self.loop)
        moved: dict[str, list[str]] = {}
        if self.half is not None:  # another world size: whole tensors, saved by the first half
            self._saved, now, moved = self._whole_audit(base, engine, optimizer, now)
        assert self._saved is not None
        if self.config.resume.layout is not None:  # other shards, other names: whole tensors instead
            for group in ("weights", "optimizer"):
                self._saved[group], now[group] = {}, {}
            moved = moved_weights(self._saved.pop("full_weights"), engine.full_after_step([optimizer])[0])
        self._restored = {**audit(self._saved, now), **moved}

    def _whole_audit(
        self, base: str, engine: engines.Engine, optimizer: Any, now: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, list[str]]]:
        """``(saved, now, moved)`` of a resharded row's load: the first half's whole tensors
        against this world size's (a collective), the scaler and schedulers as saved, and the RNG
        of a rank the first half had against its own file."""
        assert self.half is not None
        written = reshard.read_audit(base)
        params, state = engine.full_after_step([optimizer])
        moved = reshard.whole_audit(written, params, state)
        own_rank, kept = reshard.loop_file(dist.get_rank(), self.half.saved_world_size)
        rng = torch.load(os.path.join(base, f"loop_rank{own_rank}.pt"), weights_only=False)["rng"]
        saved = {
            "weights": {},
            "optimizer": {},
            "scaler": written["scaler"],
            "rng": rng if kept else [],
            "schedulers": written["schedulers"],
        }
        now = {**now, "weights": {}, "optimizer": {}, "rng": now["rng"] if kept else []}
        return saved, now, moved

    def before_step(self, step: int, engine: engines.Engine) -> None:
        """At the resumed step: whether the weights the forward starts from are the saved ones."""
        if self._saved is not None and step == self.config.resume.at and self._saved["weights"]:
            now = {n: engine.local(p) for n, p in engine.named_trainable()}
            self._at_forward = all(torch.equal(v, now[n]) for n, v in self._saved["weights"].items())

    def after_step(self, step: int, found: RankStep) -> RankStep:
        """``found`` with both audits from the resumed step on (a divergence that shows later
        still finds them); at the resumed step, finish pending work first."""
        if self._saved is not None and step == self.config.resume.at:
            for work in self.pending:
                work()
            self.pending = []
            self._audit = ResumeAudit(
                step=step,
                restored={group: tuple(names) for group, names in (self._restored or {}).items()},
                weights_at_forward=self._at_forward,
                world_sizes=(self.half.saved_world_size, dist.get_world_size())
                if self.half is not None
                else None,
            )
            self._saved = None
        if self._audit is not None:
            return dataclasses.replace(found, resume=self._audit)
        return found

    def close(self) -> None:
        """Remove the checkpoint (rank 0): after the resumed step, when every rank has loaded it, or
        when the run ends early (a failed restart leaves no folder behind)."""
        if self._base is not None and dist.is_initialized() and dist.get_rank() == 0:
            shutil.rmtree(self._base, ignore_errors=True)
        self._base = None

    # -- pieces -------------------------------------------------------------------------------------
    def _save_loop(self, base: str, step: int) -> None:
        loop = self.loop
        state = {
            "data_position": step,
            "rng": loop.rng.state if loop.rng is not None else [],
            "schedulers": [s.state_dict() for s in loop.schedulers],
        }
        torch.save(state, os.path.join(base, f"loop_rank{dist.get_rank()}.pt"))

    def _load_loop(self, base: str, step: int) -> None:
        own_rank, kept = dist.get_rank(), True
        if self.half is not None:  # another world size: a rank the saving world lacked
            own_rank, kept = reshard.loop_file(own_rank, self.half.saved_world_size)
        state = torch.load(os.path.join(base, f"loop_rank{own_rank}.pt"), weights_only=False)
        if state["data_position"] != step:
            raise ResumeError(
                f"the loop resumed at data position {state['data_position']}, the save was at {step}"
            )
        self._restore_loop(state["rng"] if kept else None, state["schedulers"], step)

    def _restore_loop(self, rng: list[torch.Tensor] | None, schedulers: list[Any], step: int) -> None:
        """Put a saved RNG and schedulers' states in place. ``rng`` ``None``: a rank that the
        saving world size did not have, on either side; its RNG starts as a run's rank of that
        number would at ``step`` (seeded by the configuration's seed, the rank and the step)."""
        carried = self.loop.rng
        if carried is not None:
            if rng is None:
                rng = CarriedRng(self.config.seed, dist.get_rank(), self.device, step=step).state
            carried.state = rng
        for scheduler, saved in zip(self.loop.schedulers, schedulers, strict=True):
            scheduler.load_state_dict(saved)

    def _phase_ok(self, phase: str, work: Callable[[], None], function: str) -> None:
        """Run ``work``; then every rank learns whether it went well on every rank (the store, not
        the group), and raises naming the rank and ``function`` if not."""
        ctx = context.current()
        self._phase += 1
        error: BaseException | None = None
        try:
            work()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as raised:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
            error = raised
        key = f"resume/{self.config.id}/{self.role}/{self._phase}/{phase}"
        if ctx.world_size > 1 and not all_ranks(ctx, key, ok=error is None):
            if error is None:
                raise ResumeError(
                    f"[rank {ctx.rank}] another rank failed in the resume's {phase} ({function}); "
                    "its error says why"
                )
        if error is not None:
            raise ResumeError(
                f"[rank {ctx.rank}] the resume's {phase} failed in {function}: "
                f"{type(error).__name__}: {error}"
            ) from error


def _new_folder() -> str:
    """One new folder every rank sees: rank 0 makes it, every rank receives its path, or the
    error rank 0 met making it, and raises it as a :class:`ResumeError` naming the setting."""
    made: list[str | OSError | None] = [None]
    if dist.get_rank() == 0:
        root = os.environ.get(DIR_ENV) or None
        try:
            made[0] = tempfile.mkdtemp(prefix="shardscale-resume-", dir=root)
        except OSError as error:
            made[0] = error
    dist.broadcast_object_list(made, src=0)
    found = made[0]
    if isinstance(found, OSError):
        raise ResumeError(
            f"[rank {dist.get_rank()}] cannot make a checkpoint folder under "
            f"{os.environ.get(DIR_ENV) or tempfile.gettempdir()}: {found}; set {DIR_ENV} to a "
            "writable folder every rank sees"
        ) from found
    assert isinstance(found, str), "rank 0 broadcasts a path or an error"
    return found


def _writable(folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".writable_rank{dist.get_rank()}")
        with open(probe, "w") as handle:
            handle.write("ok")
        os.remove(probe)
    except OSError as error:
        raise ResumeError(
            f"the checkpoint folder {folder} is not writable ({error}); set {DIR_ENV} to a writable "
            "folder every rank sees"
        ) from error


def _wrote_something(folder: str, function: str) -> None:
    """A save that returns without writing anything into ``folder`` would resume from nothing."""
    if not any(os.scandir(folder)):
        raise ResumeError(f"{function} returned but wrote nothing into the checkpoint folder {folder}")
