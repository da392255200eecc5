"""Helpers for the self-tests that run inner pytest sessions in subprocesses (not collected).

Every inner session carries a unique ``SHARDSCALE_TAG`` in its environment, which every process it
starts inherits (ranks, forkserver, DataLoader workers), so what it left behind can be found in
``/proc``; outcomes are read from the session's JUnit XML report.
"""

from __future__ import annotations

import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SPAWN_LOGGER = '''
"""Logs every interpreter start and every process-creating call of the inner session's processes,
each call with the file that made it: the innermost frame outside the standard library (``-``: the
standard library alone, as a forkserver's loop)."""
import os
import sys
import sysconfig

_LOG = os.environ["SHARDSCALE_SPAWN_LOG"]
_EVENTS = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "subprocess.Popen", "os.system")
_STDLIB = tuple({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]})


def _note(what):
    with open(_LOG, "a") as f:
        f.write(f"{os.getpid()} {what}\\n")


def _standard(path):
    return path.startswith("<frozen") or (path.startswith(_STDLIB) and "-packages" not in path)


def _origin():
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path != __file__ and not _standard(path):
            return path
        frame = frame.f_back
    return "-"


def _audit(event, args):
    if event in _EVENTS:
        _note(f"{event} {_origin()}")


with open("/proc/self/cmdline", "rb") as f:
    _note("started " + f.read().replace(b"\\0", b" ").replace(b"\\n", b" ").decode(errors="replace"))
sys.addaudithook(_audit)
'''


def log_spawns(env: dict[str, str], out: Path, log: Path) -> dict[str, str]:
    """``env`` with a ``sitecustomize`` (written under ``out``) on ``PYTHONPATH`` that logs to
    ``log`` every Python interpreter started and every fork, exec or spawn made from Python, so
    that "started no process" is an observation rather than an inference. Lines: ``pid what``."""
    site = out / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SPAWN_LOGGER)
    path = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return {**env, "SHARDSCALE_SPAWN_LOG": str(log), "PYTHONPATH": path}


def harness_spawns(lines: list[str], session_pid: int) -> list[str]:
    """The lines of a spawn log (:func:`log_spawns`) that the harness may have made: every
    interpreter started but the session's own, and every process-creating call but those whose
    innermost frame outside the standard library is in an installed package. Why not every line:
    some builds of torch start processes while ``import torch`` runs (2.14's CUDA build runs
    ``/sbin/ldconfig -p`` to find its libraries, through ``ctypes.util.find_library``), which is
    not the harness starting anything."""
    found = []
    for line in lines:
        pid, event, what = (line.split(" ", 2) + [""])[:3]
        if event == "started":
            if int(pid) != session_pid:
                found.append(line)
        elif "-packages" not in what:
            found.append(line)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def tagged_pids(tag: str) -> list[int]:
    """Pids of live processes whose environment holds ``SHARDSCALE_TAG=tag``."""
    needle = f"SHARDSCALE_TAG={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and alive(int(entry)):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def wait_until_gone(tag: str) -> list[int]:
    """The tagged processes still alive after giving them 10 s to finish exiting."""
    deadline = time.monotonic() + 10
    while tagged_pids(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    return tagged_pids(tag)


def inner_env(tag: str, out: Path) -> dict[str, str]:
    """The environment of an inner session: ours (minus pytest-xdist's), the tag and the output dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    return {**env, "SHARDSCALE_TAG": tag, "SHARDSCALE_SELFTEST_DIR": str(out), "PYTHONUNBUFFERED": "1"}


def junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """``{test name: (kind, text)}`` from a JUnit XML report; kind is ``passed``, ``failure``,
    ``error`` or ``skipped``, text the report's text and the skip message."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [child for child in case if child.tag in ("failure", "error", "skipped")]
        kind = kinds[0].tag if kinds else "passed"
        text = "".join(child.text or "" for child in kinds)
        message = next((child.get("message", "") for child in kinds if child.tag == "skipped"), "")
        outcomes[case.get("name")] = (kind, text + message)
    return outcomes
