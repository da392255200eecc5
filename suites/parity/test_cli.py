"""``python -m harness.parity`` (``make parity``) as a user runs it: progress, reports, exit status."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import user_workloads
from suites.parity.support import cli_in_process


def parity(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "harness.parity", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_list_prints_the_selected_ids_and_why_some_cannot_run_here():
    done = cli_in_process("--list", "-k", "sparse")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:3] == [
        "ddp-fp32-sgd-embedding-w2",
        "ddp-fp16-sgd_plain-embedding-w2  (not here: gloo cannot all-reduce fp16 sparse gradients "
        "('cadd_sparse' not implemented for 'Half'); the GPU tier runs it)",
        "ddp-bf16-sgd-embedding-w2",
    ]


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--world-size", "0"], "--world-size must be >= 1, got 0"),
        (["--jobs", "0"], "--jobs must be >= 1 group of ranks, got 0; e.g. --jobs 1"),
        (["-k", "fsdp2 and"], "-k 'fsdp2 and': a word or '(' is missing"),
        (["-k", "fsdp9"], "-k 'fsdp9' selects no configuration; see --list for the ids"),
        (["--scaler", "apex"], "argument --scaler: invalid choice: 'apex'"),
    ],
)
def test_bad_arguments_exit_2_with_the_fix(args, complaint):
    done = cli_in_process(*args)
    assert done.returncode == 2 and complaint in done.stderr, done.stderr


def test_a_keep_budget_that_is_not_a_number_exits_2_naming_the_variable(monkeypatch):
    monkeypatch.setenv("SHARDSCALE_PARITY_KEEP_MB", "half")
    done = cli_in_process("-k", "fsdp2-reshard-fp32-sgd-w2")
    assert done.returncode == 2, done.stderr
    assert (
        "SHARDSCALE_PARITY_KEEP_MB must be a number of MiB (e.g. SHARDSCALE_PARITY_KEEP_MB=512), got 'half'"
        in done.stderr
    )


def test_the_controller_starts_without_the_rank_side_libraries():
    """The CLI's process imports what it judges and reports with, not what only ranks run (their
    training loop, distributed checkpointing): seconds off every run's start."""
    probe = (
        "import contextlib, io, sys\n"
        "from harness.parity.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['--list', '-k', 'fsdp2 and fp32'])\n"
        "rank_side = ('harness.parity.ranks.entry', 'harness.parity.ranks.train', 'torch.distributed.checkpoint')\n"
        "print(sorted(m for m in rank_side if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_asking_whether_a_workloads_optimizer_is_fused_does_not_import_dynamo():
    """The controller builds one throwaway optimizer per workload with its own (the matrix's canary)
    before any row runs: torch's first optimizer imports dynamo (1.3-1.6 s) unless its
    ``add_param_group`` is lent as itself (``registry.fused_optimizer``); the answer is unchanged."""
    probe = (
        "import sys\n"
        "from harness.parity.workload import registry\n"
        "print(registry.fused_optimizer('harness.parity.workload.builtin.canary:canary'),\n"
        "      registry.fused_optimizer('fixtures.user_workloads:resmlp_adamw'), 'torch._dynamo' in sys.modules)\n"
        "import torch\n"
        "print(hasattr(torch.optim.Optimizer.add_param_group.__wrapped__, '__dynamo_disable'))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True", "False", "False"], done.stdout  # lent, then given back


@pytest.mark.e2e
def test_a_passing_run_shows_progress_and_writes_the_three_reports(tmp_path):
    done = parity(
        "-k",
        "suite=fsdp_vs_ddp and fsdp2 and reshard and fp32 and not offload and not (llama or convnet or canary or resume)",
        "--out",
        "out",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[1/5] pass" in done.stdout and "[5/5] pass" in done.stdout and "ETA" in done.stdout
    assert "fsdp_vs_ddp      5     5     0" in done.stdout
    data = json.loads((tmp_path / "out" / "parity.json").read_text())
    assert data["summary"]["pass"] == 5 and data["run"]["world_size"] == 2
    assert "| `fsdp2-reshard-fp32-sgd-w2` |" in (tmp_path / "out" / "parity.md").read_text()
    assert (tmp_path / "out" / "parity.png").stat().st_size > 0


@pytest.mark.e2e
def test_a_configuration_that_breaks_its_tolerance_exits_1_and_is_named(tmp_path):
    done = parity(
        "--scaler",
        "torch",
        "-k",
        "forced_inf and fsdp1 and adam_fused and one_rank and inf@",
        "--no-plot",
        cwd=tmp_path,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    broken = "fsdp1-full_shard-flat-fp32-adam_fused-inf@r1s2-inf@r1s6-torch_scaler-w2"
    assert f"parity: 1 configuration(s) broke their tolerance: {broken}" in done.stdout
    assert (
        f"xfail {broken} [expected]: step 2, scale differs across ranks: rank 0=2048.0, rank 1=512.0"
        in done.stdout
    )
    assert not (tmp_path / "reports" / "parity.png").exists()


# -- a user's own workload, from a folder outside the checkout ----------------------------------------
USER_WORKLOADS = Path(__file__).parents[2] / "fixtures" / "user_workloads.py"


@pytest.fixture
def user_folder(tmp_path):
    """A fresh folder holding the user's ``my_workloads.py`` (nothing else of the project)."""
    shutil.copy(USER_WORKLOADS, tmp_path / "my_workloads.py")
    return tmp_path


@pytest.mark.e2e
def test_a_users_workload_runs_from_the_current_folder(user_folder):
    done = parity(
        "--workload",
        "my_workloads:resmlp",
        "-k",
        "fsdp2 and keep and pure-bf16 and not offload and sgd",
        "--no-plot",
        cwd=user_folder,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[1/1] pass  fsdp2-keep-bf16-sgd-resmlp-w2" in done.stdout


@pytest.fixture
def broken_run(user_folder):
    """A model whose weight decay reads ``model.parameters()`` outside forward, where FSDP1 holds
    each rank's shard: ``(completed CLI run, {id: parity.json row})`` for FULL_SHARD, flat and
    original parameters."""
    done = parity(
        "--workload",
        "my_workloads:l2_outside_forward",
        "-k",
        "full_shard and fp32 and sgd and suite=fsdp_vs_ddp",
        "--no-plot",
        cwd=user_folder,
    )
    rows = json.loads((user_folder / "reports" / "parity.json").read_text())["configs"]
    return done, {row["id"]: row for row in rows}


@pytest.mark.e2e
def test_a_model_that_trains_differently_when_sharded_fails_naming_the_step_and_the_tensor(broken_run):
    done, rows = broken_run
    assert done.returncode == 1, done.stdout + done.stderr
    row = rows["fsdp1-full_shard-orig-fp32-sgd-l2_outside_forward-w2"]
    assert row["status"] == "fail" and row["first_diverging_step"] == 0
    assert f"FAIL {row['id']}: step 0, rank 0 loss" in done.stdout
    parameters = {name for name, _ in user_workloads.ResMLP().named_parameters()}
    assert row["worst"]["step"] == 0 and row["worst"]["name"] in parameters, row["worst"]


@pytest.mark.e2e
def test_a_model_that_crashes_only_under_fsdp_is_a_crash_row_with_its_traceback(broken_run, user_folder):
    done, rows = broken_run
    row = rows["fsdp1-full_shard-flat-fp32-sgd-l2_outside_forward-w2"]
    assert row["status"] == "crash", row
    assert f"CRASH {row['id']}: step 0, the candidate raised" in done.stdout
    markdown = (user_folder / "reports" / "parity.md").read_text()
    assert "Traceback (most recent call last)" in markdown, markdown


def _installed_package(folder):
    """A package that names its workload in the ``shardscale.workloads`` entry-point group, as its
    wheel's metadata would (a ``.dist-info`` folder on ``sys.path``)."""
    shutil.copy(USER_WORKLOADS, folder / "resmlp_parity.py")
    info = folder / "resmlp_models-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: resmlp-models\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[shardscale.workloads]\nresmlp = resmlp_parity:resmlp\n")
    return {**os.environ, "PYTHONPATH": str(folder)}


class _Started:
    """``python -m harness.parity ARGS``, started now; :meth:`done` waits for it."""

    def __init__(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "harness.parity", *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._done: subprocess.CompletedProcess | None = None

    def done(self) -> subprocess.CompletedProcess:
        if self._done is None:
            out, err = self._process.communicate(timeout=600)
            self._done = subprocess.CompletedProcess(self._process.args, self._process.returncode, out, err)
        return self._done

    def stop(self) -> None:
        if self._done is None:
            self._process.kill()
            self._process.communicate()


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The runs of a user's command that end before anything trains (a workload that cannot be
    used, ``--list``), each in a new interpreter from a folder outside the checkout, started side by
    side: ``{name: _Started}``. Why together: each costs seconds of one core importing torch while
    the ranks idle, so on two cores two at a time take about half as long as one after another."""
    user = tmp_path_factory.mktemp("user")
    shutil.copy(USER_WORKLOADS, user / "my_workloads.py")
    installed = tmp_path_factory.mktemp("installed")
    env = _installed_package(installed)
    runs = {
        "my_workloads:data_not_deterministic": _Started(
            "--workload", "my_workloads:data_not_deterministic", cwd=user
        ),
        "not_here:resmlp": _Started("--workload", "not_here:resmlp", cwd=user),
        "units_auto": _Started(
            "--workload", "my_workloads:resmlp_auto", "--list", "-k", "fsdp2 and bf16", cwd=user
        ),
        "units_auto_without_names": _Started(
            "--workload", "my_workloads:auto_without_names", "--list", cwd=user
        ),
        "installed": _Started("--list", "-k", "sparse", cwd=installed / "..", env=env),
    }
    yield runs
    for run in runs.values():
        run.stop()


@pytest.mark.parametrize(
    ("workload", "complaint"),
    [
        ("my_workloads:data_not_deterministic", "returned different data on two calls"),
        ("not_here:resmlp", "no module named 'not_here'; run from the folder that holds not_here.py"),
    ],
)
def test_a_workload_that_cannot_be_used_exits_2_naming_the_fix(quick, workload, complaint):
    done = quick[workload].done()
    assert done.returncode == 2 and complaint in done.stderr, done.stderr


def test_list_says_which_units_auto_chose_from_no_split_modules(quick):
    done = quick["units_auto"].done()
    assert done.returncode == 0, done.stderr
    assert (
        "units of resmlp_auto: ResBlock (auto, from NamedResMLP._no_split_modules)"
        in done.stdout.splitlines()
    )


def test_units_auto_on_a_model_without_no_split_modules_exits_2_naming_the_fix(quick):
    done = quick["units_auto_without_names"].done()
    assert done.returncode == 2
    assert "ResMLP._no_split_modules, which is None; name the FSDP units yourself" in done.stderr


def test_list_shows_the_builtin_workloads_and_those_installed_packages_name(quick):
    done = quick["installed"].done()
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "  llama          harness.parity.workload.builtin.llama:llama  (built-in)" in lines
    assert "  resmlp         resmlp_parity:resmlp  (entry point of resmlp-models)" in lines


@pytest.mark.e2e
def test_a_workload_named_by_an_entry_point_runs_by_its_name(tmp_path):
    env = _installed_package(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "harness.parity", "--workload", "resmlp", "-k", "ddp and inf@r1", "--no-plot"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pass  ddp-fp32-sgd-resmlp-inf@r1s2-inf@r1s5-w2" in done.stdout


def test_list_into_a_reader_that_stops_early_exits_quietly():
    """``--list | head -1``: the reader closing the pipe ends the listing, without a traceback."""
    listing = subprocess.Popen(
        [sys.executable, "-m", "harness.parity", "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert listing.stdout is not None
    first = listing.stdout.readline()
    listing.stdout.close()  # the reader goes away, as head does
    _, stderr = listing.communicate(timeout=120)
    assert first.startswith(b"fsdp1-") and listing.returncode == 0, stderr
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr


@pytest.mark.parametrize(
    ("argv", "env", "starts"),
    [
        (["--ground-truth"], {}, True),
        (["--list"], {}, False),
        (["--help"], {}, False),
        (
            ["--world-size", "2"],
            dict(RANK="0", WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1"),
            False,
        ),  # torchrun
    ],
)
def test_the_cli_starts_the_ranks_forkserver_before_its_imports_only_where_ranks_start(
    monkeypatch, argv, env, starts
):
    from harness.controller import reaper
    from harness.parity.doors import early

    started: list[str] = []
    monkeypatch.setattr(reaper, "start_tagged_forkserver", started.append)
    monkeypatch.setattr(reaper, "PRELOAD", ["harness.rank.rank_main"])
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert early.start(argv) is starts
    assert (started == [reaper.controller_tag()]) is starts
    assert (early.RANK_MODULE in reaper.PRELOAD) is starts


def test_the_cli_exits_after_its_exit_handlers_without_the_interpreters_teardown():
    """``cli.exit_now``: what was printed and what the exit handlers print arrive, with the code;
    the objects left for the teardown are not freed one by one (1.3 s with torch loaded)."""
    probe = (
        "import atexit\n"
        "from harness.parity.doors import cli\n"
        "class Late:\n"
        "    def __del__(self):\n"
        "        print('torn down')\n"
        "kept = Late()\n"
        "atexit.register(print, 'exit handler')\n"
        "print('reports written')\n"
        "cli.exit_now(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (3, "reports written\nexit handler\n"), done


def test_under_a_profiler_the_cli_exits_as_usual_so_the_profile_is_written(tmp_path):
    script = tmp_path / "ends.py"
    script.write_text("from harness.parity.doors import cli\ncli.exit_now(0)\n")
    written = tmp_path / "cli.prof"
    done = subprocess.run(
        [sys.executable, "-m", "cProfile", "-o", str(written), str(script)],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert written.stat().st_size > 0
