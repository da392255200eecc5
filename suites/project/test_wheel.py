"""The wheel ships the library and the harness, nothing else: no top-level ``fixtures`` (an unrelated
PyPI package of that name would be overwritten) and no test suites; the parity engine runs from it."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (path,) = out.glob("shardscale-*.whl")
    return path


def test_the_wheel_holds_exactly_the_library_and_the_harness(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"scaler", "harness"}
    assert "harness/parity/workload/registry.py" in names and "harness/parity/__main__.py" in names
    assert (
        "harness/parity/workload/builtin/llama.py" in names
        and "harness/parity/workload/builtin/convnet.py" in names
    )


def test_the_wheel_registers_the_pytest_plugin(wheel):
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
    assert "[pytest11]\nshardscale = harness.frontends.plugin" in archive.read(entry_points).decode()


@pytest.mark.e2e
def test_the_parity_engine_runs_from_the_unpacked_wheel_alone(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "import harness.parity.workload.registry as w, scaler; print(w.__file__, scaler.__file__)",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr
    assert all(path.startswith(str(site)) for path in found.stdout.split())
    listed = subprocess.run(
        [sys.executable, "-m", "harness.parity", "--list", "-k", "sparse"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0 and "ddp-fp32-sgd-embedding-w2" in listed.stdout, listed.stderr


@pytest.mark.e2e
def test_a_users_workload_in_a_fresh_folder_runs_on_the_engine_from_the_wheel(wheel, tmp_path):
    """The contract's promise: a module of the user's, outside any checkout, found from the current
    folder, checked on the engine the wheel installed."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    user = tmp_path / "user"
    user.mkdir()
    (user / "my_workloads.py").write_text((ROOT / "fixtures" / "user_workloads.py").read_text())
    done = subprocess.run(
        [sys.executable, "-m", "harness.parity", "--workload", "my_workloads:resmlp", "-k", "ddp and inf@r1"],
        cwd=user,
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pass  ddp-fp32-sgd-resmlp-inf@r1s2-inf@r1s5-w2" in done.stdout
    assert (user / "reports" / "parity.json").exists()
