"""The inside of a warm-pool rank: a loop that takes commands and runs cases.

Why it looks like this: the controller starts every rank from a forkserver that has imported this
module (and so torch) once, so a rank starts in milliseconds. A rank then

* leaves the controller's process group (``setpgid``) so the pool can kill it together with any
  DataLoader workers it started, and so a terminal's Ctrl-C reaches only pytest;
* asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``; the parent is the
  forkserver, which exits when pytest dies) and runs a watchdog thread polling the controller pid,
  so no rank outlives pytest, even a ``SIGKILL`` of pytest;
* writes stdout and stderr to a file each, and has ``faulthandler`` write Python stacks to a third
  (on ``SIGUSR1``, and when the rank crashes), so the controller can get every thread's stack even
  while a C call holds the GIL, and never mistakes a stack dump for the test's output or failure;
* pins torch to ``threads`` intra-op threads (1 by default: ranks share the machine's cores);
* carries, from the forkserver's environment, the controller's ``SHARDSCALE_POOL_TAG``, which
  everything it forks or execs inherits, so the controller finds what it left running by that tag.

It imports nothing of the controller side (``pool.py``, ``plugin.py``).
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from harness.protocol import (
    Ack,
    CaseFinished,
    Heartbeat,
    InitGroup,
    LeaveGroup,
    Message,
    RankFiles,
    RankStarted,
    RunCase,
    Shutdown,
    from_wire,
)
from harness.rank import context, execute
from harness.torch_private import c10d, dtensor

STACK_SIGNAL = signal.SIGUSR1
_PR_SET_PDEATHSIG = 1


def _guard_against_orphaning(controller_pid: int) -> None:
    """Die with the parent (kernel) and with the controller (watchdog thread, 0.5 s poll)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            try:
                os.kill(controller_pid, 0)
            except ProcessLookupError:
                os._exit(70)
            except PermissionError:
                pass
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="shardscale-watchdog", daemon=True).start()


_stacks_file: Any = None  # faulthandler writes to it for the rank's whole life


def _redirect_output(files: RankFiles) -> None:
    """Send fds 1 and 2 to the rank's stdout and stderr files, and faulthandler to its stacks file."""
    global _stacks_file
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, path in ((1, files.stdout), (2, files.stderr)):
        new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(new, fd)
        os.close(new)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - lives as long as the rank
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    _stacks_file = open(files.stacks, "a", buffering=1)  # noqa: SIM115
    faulthandler.enable(file=_stacks_file, all_threads=True)
    faulthandler.register(STACK_SIGNAL, file=_stacks_file, all_threads=True, chain=False)


def _forget_destroyed_groups() -> None:
    """Drop what torch caches across process groups once they are destroyed, so that a later case
    runs as it would in a fresh process.

    DTensor caches sharding decisions keyed by device-mesh equality, which ignores the mesh's
    process groups: without this, a case after the group was rebuilt can get back a mesh of a
    destroyed group ("Could not resolve the process group registered under the name 3")."""
    dtensor.clear_sharding_cache()


class RankServer:
    """Serves one rank: dispatches each command to ``_on_<kind>`` and emits events."""

    def __init__(self, rank: int, conn: Any, store_host: str, store_port: int) -> None:
        self.rank = rank
        self.conn = conn
        self.store = dist.TCPStore(store_host, store_port, is_master=False, timeout=timedelta(seconds=60))
        self.backend = ""
        self.world_size = 0
        self.group_prefix = ""
        self.device = torch.device("cpu")
        self.timeout_s = 0.0
        self._resets = 0

    def emit(self, event: Message) -> None:
        self.conn.send(event.to_wire())

    def serve(self) -> None:
        self.emit(RankStarted(rank=self.rank, pid=os.getpid()))
        while True:
            try:
                command = from_wire(self.conn.recv())
            except (EOFError, OSError):  # the controller went away: nothing left to do
                break
            if isinstance(command, Shutdown):
                break
            handler = getattr(self, f"_on_{command.kind}")
            handler(command)
        self._leave()

    # -- process group ------------------------------------------------------------------------
    def _leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        _forget_destroyed_groups()

    def _join(self, backend: str, world_size: int, prefix: str, timeout_s: float) -> None:
        self._leave()
        if backend == "nccl":
            self.device = torch.device("cuda", self.rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"{prefix}/", self.store),
            rank=self.rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        context.advance_group_generation()
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(self.rank))
        self.backend, self.world_size, self.group_prefix, self.timeout_s = (
            backend,
            world_size,
            prefix,
            timeout_s,
        )

    def _on_init_group(self, command: InitGroup) -> None:
        self._resets = 0  # every member of the new group counts its resets from the same start
        try:
            self._join(command.backend, command.world_size, command.prefix, command.collective_timeout_s)
            self.emit(Ack(rank=self.rank, command=command.kind))
        except Exception:  # noqa: BLE001 - reported to the controller, which fails the test
            self.emit(Ack(rank=self.rank, command=command.kind, error=traceback.format_exc()))

    def _on_leave_group(self, command: LeaveGroup) -> None:
        try:
            self._leave()
            self.emit(Ack(rank=self.rank, command=command.kind))
        except Exception:  # noqa: BLE001
            self.emit(Ack(rank=self.rank, command=command.kind, error=traceback.format_exc()))

    def _reset_group(self, suffix: str) -> None:
        self._resets += 1  # keeps every reset's store keys apart, whatever suffix callers pass
        prefix = f"{self.group_prefix}/reset{self._resets}-{suffix}"
        self._join(self.backend, self.world_size, prefix, self.timeout_s)

    # -- cases ----------------------------------------------------------------------------------
    def _on_run_case(self, command: RunCase) -> None:
        execute.add_sys_path(command.sys_path)
        if command.collective_timeout_s != self.timeout_s and dist.is_initialized():
            c10d.set_timeout(timedelta(seconds=command.collective_timeout_s))
            self.timeout_s = command.collective_timeout_s
        context._set_current(
            context.RankContext(
                rank=self.rank,
                world_size=self.world_size,
                backend=self.backend,
                device=self.device,
                store=dist.PrefixStore(f"{command.prefix}/", self.store),
                reset_group=self._reset_group,
            ),
            beat=lambda: self.emit(Heartbeat(case_id=command.case_id, rank=self.rank)),
        )
        started = time.perf_counter()
        try:
            status, value, text, headline = execute.call_case(
                command.target, command.args, command.kwargs, rank=self.rank, world_size=self.world_size
            )
        finally:
            context._set_current(None)
        sys.stdout.flush()
        sys.stderr.flush()
        self.emit(
            CaseFinished(
                case_id=command.case_id,
                rank=self.rank,
                status=status,
                value=value,
                text=text,
                headline=headline,
                duration_s=time.perf_counter() - started,
            )
        )
        if status != "passed":
            # Closing our connections unblocks peers waiting in a collective with us at once; the
            # controller re-creates the group before the next case.
            try:
                self._leave()
            except Exception:  # noqa: BLE001 - the group is rebuilt anyway
                traceback.print_exc()


def rank_entry(
    rank: int,
    conn: Any,
    files: RankFiles,
    controller_pid: int,
    store_host: str,
    store_port: int,
    threads: int,
) -> None:
    """Process entry point of a pool rank (called by multiprocessing in the forked child)."""
    os.setpgid(0, 0)
    # A forkserver child inherits the "forkserver" start method; a test that starts DataLoader
    # workers should get the platform default (fork on Linux before 3.14), as in a plain process,
    # not a fresh forkserver that re-imports torch for seconds.
    multiprocessing.set_start_method(None, force=True)
    _guard_against_orphaning(controller_pid)
    _redirect_output(files)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    # Everything alive now (torch and the harness, imported by the forkserver) lives as long as
    # the rank: a full collection need not walk it again, and a case's collections stay cheap.
    gc.freeze()
    server = RankServer(rank, conn, store_host, store_port)
    server.serve()
    sys.stdout.flush()
    sys.stderr.flush()
