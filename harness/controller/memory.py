"""Why a rank was killed, and how much memory the ranks held (controller side).

Why the controller finds this out: a rank killed with ``SIGKILL`` cannot say anything itself, and
``rank 0 died with signal SIGKILL (-9)`` does not tell a person whether the model did not fit in
memory (the kernel's OOM killer), a person or a tool killed it, or the machine ran out. The
controller is alive, so it watches, for the whole case:

* every rank's memory (``VmHWM``, the peak resident set of the process, and ``VmRSS``, read from
  ``/proc/<pid>/status`` each time the pool's loop wakes up, so the last figures before a death are
  known even though the process and its ``/proc`` entry are gone);
* the OOM kills of its cgroup (line ``oom_kill`` of cgroup v2 ``memory.events``, or of cgroup v1
  ``memory.oom_control``: counted before the case and again when a rank dies; the count covers the
  cgroup's descendants, where the ranks run);
* the kernel log (``dmesg``), when this process may read it, for a line naming the dead rank's pid.

Every source is optional: a machine without cgroup v2 or with ``dmesg`` forbidden gets an answer
that says what could not be read, never an error. Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

_GB = 1024**3
_CGROUP_ROOT = "/sys/fs/cgroup"
_DMESG_TIMEOUT_S = 2.0


def oom_events_file(proc_cgroup: str = "/proc/self/cgroup", root: str = _CGROUP_ROOT) -> str | None:
    """The file that counts this process's cgroup's OOM kills (an ``oom_kill N`` line), or ``None``.

    cgroup v2: ``memory.events`` of the ``0::/path`` cgroup (under ``root``, or ``root/unified`` on a
    hybrid mount). cgroup v1 (the memory controller's ``N:memory:/path`` line): ``memory.oom_control``
    of that cgroup, or of the mount's root, which is the container's own cgroup where the path is
    not visible inside it."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        path = path.lstrip("/")
        if line.startswith("0::"):
            candidates += [os.path.join(root, path, "memory.events")]
            candidates += [os.path.join(root, "unified", path, "memory.events")]
        elif "memory" in controllers.split(","):
            candidates += [os.path.join(root, "memory", path, "memory.oom_control")]
            candidates += [os.path.join(root, "memory", "memory.oom_control")]
    return next((c for c in candidates if oom_kills(c) is not None), None)


def oom_kills(events_file: str | None) -> int | None:
    """The ``oom_kill`` count in ``events_file`` (``None`` when unreadable or absent)."""
    if events_file is None:
        return None
    try:
        with open(events_file) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def rss(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """``(peak, current)`` resident bytes of ``pid`` (``VmHWM``, ``VmRSS``), ``None`` once it is gone."""
    found: dict[str, int] = {}
    try:
        with open(os.path.join(proc, str(pid), "status")) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmHWM", "VmRSS"):
                    found[key] = int(value.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    if "VmHWM" not in found:
        return None
    return found["VmHWM"], found.get("VmRSS", 0)


def kernel_log_names_oom(pid: int, log: str | None = None) -> bool | None:
    """Whether the kernel log says the OOM killer killed ``pid`` (``None``: the log is unreadable,
    as ``dmesg`` is for unprivileged users on most machines). ``log`` is for tests."""
    if log is None:
        try:
            done = subprocess.run(
                ["dmesg"], capture_output=True, text=True, timeout=_DMESG_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0 or not done.stdout:
            return None
        log = done.stdout
    pattern = re.compile(rf"(Killed process {pid}\b|oom-kill:.*\bpid={pid}\b|Out of memory: Kill.* {pid}\b)")
    return pattern.search(log) is not None


def gb(size: int) -> str:
    """``1.23 GB``, or ``345 MB`` below a gigabyte."""
    return f"{size / _GB:.2f} GB" if size >= _GB else f"{size / 1024**2:.0f} MB"


class MemoryWatch:
    """One case's watch over the ranks' memory and the cgroup's OOM kills (see the module docstring)."""

    def __init__(self, pids: dict[int, int | None], *, events_file: str | None = None) -> None:
        """``pids``: each rank's pid (``None`` for a rank not started); ``events_file``: the file
        counting OOM kills (default: :func:`oom_events_file` of this process)."""
        self.pids = {rank: pid for rank, pid in pids.items() if pid is not None}
        self.events_file = events_file if events_file is not None else oom_events_file()
        self.oom_before = oom_kills(self.events_file)
        self.peak: dict[int, int] = {}
        self.current: dict[int, int] = {}
        self.sample()

    def sample(self) -> None:
        """Read every live rank's memory now (cheap: one small ``/proc`` file per rank)."""
        for rank, pid in self.pids.items():
            figures = rss(pid)
            if figures is not None:
                self.peak[rank] = max(self.peak.get(rank, 0), figures[0])
                self.current[rank] = figures[1]

    def explain_death(self, rank: int, exitcode: int | None) -> str:
        """What is known of why ``rank`` ended with ``exitcode``: for ``SIGKILL``, whether the OOM
        killer did it; for any death, the memory every rank held (and the controller's)."""
        parts = []
        if exitcode == -signal.SIGKILL:
            parts.append(self._oom_verdict(rank))
        parts.append(self.held())
        return "; ".join(parts)

    def _oom_verdict(self, rank: int) -> str:
        after = oom_kills(self.events_file)
        pid = self.pids.get(rank)
        in_log = kernel_log_names_oom(pid) if pid is not None else None
        if in_log or (self.oom_before is not None and after is not None and after > self.oom_before):
            how = []
            if self.oom_before is not None and after is not None and after > self.oom_before:
                how.append(f"the cgroup's oom_kill count went {self.oom_before} -> {after}")
            if in_log:
                how.append(f"the kernel log names pid {pid}")
            return f"killed by the OOM killer: memory ran out ({', '.join(how)})"
        if after is not None and self.oom_before is not None:
            log = "" if in_log is None else "; the kernel log names no OOM kill of it"
            return f"not the OOM killer (the cgroup's oom_kill count stayed {after}{log})"
        if in_log is False:
            return "not the OOM killer (the kernel log names no OOM kill of it)"
        return "unknown whether the OOM killer did it (no cgroup OOM counter, kernel log unreadable)"

    def held(self) -> str:
        """``memory held: rank 0 peak 1.20 GB (last 1.10 GB), ...; controller peak 0.30 GB``."""
        ranks = ", ".join(
            f"rank {rank} peak {gb(self.peak[rank])} (last seen {gb(self.current.get(rank, 0))})"
            for rank in sorted(self.peak)
        )
        own = rss(os.getpid())
        controller = f"controller peak {gb(own[0])}" if own is not None else ""
        return "memory held: " + ("; ".join(p for p in (ranks, controller) if p) or "not readable")
