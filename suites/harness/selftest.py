"""Helpers for the self-tests that run inner pytest sessions in subprocesses (not collected).

Every inner session carries a unique ``SHARDSCALE_TAG`` in its environment, which every process it
starts inherits (ranks, forkserver, DataLoader workers), so what it left behind can be found in
``/proc``; outcomes are read from the session's JUnit XML report.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path


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
