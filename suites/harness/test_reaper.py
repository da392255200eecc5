"""harness.controller.reaper on its own: what counts as a root's family, and which processes carry a tag."""

from __future__ import annotations

import os
import subprocess
import uuid

from harness.controller import reaper
from harness.controller.reaper import Proc


def test_family_is_roots_their_groups_and_their_descendants():
    procs = {
        p.pid: p
        for p in [
            Proc(pid=10, ppid=1, pgrp=10),  # a root (a rank, group leader)
            Proc(pid=11, ppid=10, pgrp=10),  # its child in its group
            Proc(pid=12, ppid=1, pgrp=10),  # orphaned, still in its group
            Proc(pid=13, ppid=11, pgrp=13),  # grandchild in a new session
            Proc(pid=14, ppid=13, pgrp=13),  # ... and its child
            Proc(pid=20, ppid=1, pgrp=20),  # someone else
            Proc(pid=21, ppid=20, pgrp=20),
        ]
    }
    assert reaper.family(procs, [10, 99]) == {10, 11, 12, 13, 14}
    assert reaper.family(procs, []) == set()


def test_only_processes_exec_d_with_the_tag_carry_it():
    """The exact tag, alone or appended by a nested session's forkserver (``outer:inner``)."""
    tag = uuid.uuid4().hex
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    env = {k: v for k, v in os.environ.items() if k != reaper.TAG_VAR}
    procs = {
        "tagged": subprocess.Popen(["sleep", "600"], env={**env, reaper.TAG_VAR: tag}, **quiet),
        "nested": subprocess.Popen(["sleep", "600"], env={**env, reaper.TAG_VAR: f"ab12:{tag}"}, **quiet),
        "prefix": subprocess.Popen(["sleep", "600"], env={**env, reaper.TAG_VAR: tag[:-1]}, **quiet),
        "other": subprocess.Popen(["sleep", "600"], env={**env, reaper.TAG_VAR: uuid.uuid4().hex}, **quiet),
        "untagged": subprocess.Popen(["sleep", "600"], env=env, start_new_session=True, **quiet),
    }
    try:
        assert {name for name, p in procs.items() if reaper.carries_tag(p.pid, tag)} == {"tagged", "nested"}
        assert sorted(reaper.tagged_processes(tag)) == sorted([procs["tagged"].pid, procs["nested"].pid])
        assert not reaper.kill_if_tagged(procs["other"].pid, tag)
        assert not reaper.killpg_if_tagged(procs["untagged"].pid, tag)
        assert reaper.kill_if_tagged(procs["tagged"].pid, tag)
        assert procs["tagged"].wait(10) == -9
        assert [name for name, p in procs.items() if p.poll() is not None] == ["tagged"]
        assert reaper.kill_if_tagged(procs["nested"].pid, tag)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
