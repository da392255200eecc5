"""The spawn log the no-process self-tests read (``selftest.log_spawns``) tells the harness's
spawns from what an installed package starts while it is imported.

Why: PyPI's CUDA build of torch 2.14 runs ``/sbin/ldconfig -p`` during ``import torch`` (its CUDA
library finder); a test that counted every spawn failed on it, though the harness started nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

from suites.harness.selftest import harness_spawns, log_spawns

SPAWNS_ON_IMPORT = "import subprocess\nsubprocess.run(['true'], check=True)\n"


def test_a_spawn_made_while_a_package_is_imported_is_told_from_ones_own(tmp_path):
    package = tmp_path / "lib" / "site-packages" / "cudafinder"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(SPAWNS_ON_IMPORT)
    log = tmp_path / "spawn.log"
    env = log_spawns(dict(os.environ), tmp_path, log)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(package.parent)])
    own = "import cudafinder\nimport subprocess\nsubprocess.run(['true'], check=True)\n"
    subprocess.run([sys.executable, "-c", own], env=env, timeout=60, check=True)
    lines = log.read_text().splitlines()
    popens = [line for line in lines if line.split(" ", 2)[1] == "subprocess.Popen"]
    assert len(popens) == 2, lines
    assert popens[0].endswith(str(package / "__init__.py")), lines
    assert harness_spawns(lines, proc_pid(lines)) == [popens[1]], lines


def test_an_interpreter_started_besides_the_sessions_own_is_counted(tmp_path):
    log = tmp_path / "spawn.log"
    env = log_spawns(dict(os.environ), tmp_path, log)
    child = "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'pass'], check=True)\n"
    subprocess.run([sys.executable, "-c", child], env=env, timeout=60, check=True)
    lines = log.read_text().splitlines()
    started = [line for line in lines if line.split(" ", 2)[1] == "started"]
    assert len(started) == 2, lines
    assert started[1] in harness_spawns(lines, proc_pid(lines)), lines


def proc_pid(lines: list[str]) -> int:
    """The pid of the first interpreter the log saw start: the session's own."""
    return int(lines[0].split(" ", 1)[0])
