"""The ready CI workflows under ``ci/workflows``: valid YAML whose every command exists here.

A workflow is only ever run on someone else's machine, so a renamed make target, script or gate
option would break CI without any local run noticing; these tests notice.
"""

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from ci.gate import cli, suites

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / "ci" / "workflows").glob("*.yml"))


def _targets():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    return {line.split()[0] for line in out.stdout.splitlines()[1:]}


def _make_variables():
    return set(re.findall(r"^([A-Z_]+)\s*\??=", (ROOT / "Makefile").read_text(), flags=re.M))


def _run_lines(workflow):
    document = yaml.safe_load(workflow.read_text())
    for job in document["jobs"].values():
        for step in job["steps"]:
            if "run" in step:
                for line in step["run"].splitlines():
                    if line.strip():
                        yield shlex.split(line)


def test_there_is_a_cpu_and_a_gpu_workflow():
    assert [w.name for w in WORKFLOWS] == ["cpu.yml", "gpu.yml"]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: w.name)
def test_every_make_target_and_variable_it_calls_exists(workflow):
    targets, variables = _targets(), _make_variables()
    calls = [words for words in _run_lines(workflow) if words[0] == "make"]
    assert calls
    for words in calls:
        for word in words[1:]:
            if "=" in word:
                assert word.split("=")[0] in variables, (
                    f"{workflow.name}: make variable {word} is not in the Makefile"
                )
            else:
                assert word in targets, f"{workflow.name}: make {word} is not a target (make help)"


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: w.name)
def test_every_gate_option_it_passes_is_one_the_gate_accepts(workflow):
    for words in _run_lines(workflow):
        for word in words:
            if word.startswith("GATE_ARGS="):
                cli.parse_args(shlex.split(word.split("=", 1)[1]))  # exits 2 on an unknown option


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: w.name)
def test_every_command_is_a_make_target_or_a_known_tool(workflow):
    for words in _run_lines(workflow):
        assert words[0] in ("make", "nvidia-smi"), f"{workflow.name}: unexpected command {words}"


def test_the_cpu_workflow_covers_the_pinned_and_the_oldest_supported_torch_and_uploads_reports():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    versions = [entry["torch"] for entry in document["jobs"]["gate"]["strategy"]["matrix"]["include"]]
    pinned = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    floor = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert pinned in versions and f"{floor}.0" in versions
    uploads = [
        s
        for s in document["jobs"]["gate"]["steps"]
        if s.get("uses", "").startswith("actions/upload-artifact")
    ]
    assert uploads and uploads[0]["with"]["path"] == "reports/" and uploads[0]["if"] == "always()"


def test_the_gpu_workflow_runs_the_gpu_tier_in_strict_mode_on_a_self_hosted_runner():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "gpu.yml").read_text())
    (job,) = document["jobs"].values()
    assert "self-hosted" in job["runs-on"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert any(re.fullmatch(r"make test-gpu REQUIRE_GPUS=[1-9]\d*", run) for run in runs), runs


def test_the_gate_runs_the_suites_make_test_runs():
    """The CPU workflow runs `make gate` in place of `make test`: same suites, one session (`make
    test` spreads its session over two xdist workers, a module to each at a time)."""
    make_test = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    pytest_line = next(line for line in make_test.stdout.splitlines() if "-m pytest" in line)
    args = shlex.split(pytest_line.split("-m pytest", 1)[1])
    marker = args[args.index("-m") + 1]
    tests = [a for a in args if not a.startswith("-") and a != marker]
    assert tests == list(suites.DEFAULT_TESTS)
    assert (
        marker
        == "not e2e and not world_sizes and not two_d and not pipeline and not property and not compile"
    ), "make test leaves the end-to-end, world-size, 2-D and compiled tiers and the drawn property sample out"
    command = suites.pytest_command(
        suites.CPU, tests=suites.DEFAULT_TESTS, keyword="", out=Path("o"), plot=True
    )
    assert command[3 : 3 + len(tests)] == tests
    assert command[command.index("-m", 3) + 1] == f"not gpu and {marker}"


def test_the_cpu_workflow_checks_verdicts_under_every_kernel_family():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    commands = [step.get("run", "") for step in document["jobs"]["kernels"]["steps"]]
    assert "make kernels" in commands


def test_the_cpu_workflow_runs_the_real_model_tier_in_a_job_of_its_own():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    commands = [step.get("run", "") for step in document["jobs"]["models"]["steps"]]
    assert "make models" in commands


def test_the_cpu_workflow_runs_the_world_size_tier_in_a_job_of_its_own():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    commands = [step.get("run", "") for step in document["jobs"]["world-sizes"]["steps"]]
    assert "make world-sizes" in commands


def test_the_cpu_workflow_runs_the_two_d_tier_in_a_job_of_its_own():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    commands = [step.get("run", "") for step in document["jobs"]["two-d"]["steps"]]
    assert "make two-d" in commands


def test_the_cpu_workflow_runs_the_judges_property_tier_in_a_job_of_its_own():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    commands = [step.get("run", "") for step in document["jobs"]["property"]["steps"]]
    assert "make property" in commands


def test_the_cpu_workflow_runs_the_end_to_end_tier_in_a_job_of_its_own():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    commands = [step.get("run", "") for step in document["jobs"]["e2e"]["steps"]]
    assert "make e2e" in commands


# The make targets that are a tier of tests or checks, and the workflow that runs each: a tier that
# `make test` leaves out is run by CI only if a job says so.
TIERS = {
    "test": "cpu.yml",  # as `make gate`, the same session
    "e2e": "cpu.yml",
    "world-sizes": "cpu.yml",
    "reshard": "cpu.yml",
    "two-d": "cpu.yml",
    "pipeline": "cpu.yml",
    "property": "cpu.yml",
    "compile": "cpu.yml",
    "models": "cpu.yml",
    "kernels": "cpu.yml",
    "mutation": "cpu.yml",
    "test-gpu": "gpu.yml",
}


def test_every_make_tier_has_a_ci_job():
    """Every target that runs suites or checks runs in a workflow (``make test`` as ``make gate``),
    and every target not listed here is a tool (help, setup, parity, bench, demo, lint, clean)."""
    assert set(TIERS) <= _targets()
    for target, workflow in TIERS.items():
        runs = {" ".join(line[:2]) for line in _run_lines(ROOT / "ci" / "workflows" / workflow)}
        wanted = "make gate" if target == "test" else f"make {target}"
        assert wanted in runs, f"make {target} has no CI job in {workflow}: {sorted(runs)}"
    pytest_targets = {
        line.split(":", 1)[0]
        for line in (ROOT / "Makefile").read_text().splitlines()
        if re.match(r"^[a-z0-9-]+: .*##", line)
    }
    tools = {"help", "setup", "parity", "gate", "bench", "demo", "lint", "clean"}
    assert pytest_targets - tools == set(TIERS), "a new make tier needs a CI job (and a row in TIERS)"


def test_the_cpu_workflow_runs_the_resharded_resume_tier_in_a_job_of_its_own():
    document = yaml.safe_load((ROOT / "ci" / "workflows" / "cpu.yml").read_text())
    commands = [step.get("run", "") for step in document["jobs"]["reshard"]["steps"]]
    assert "make reshard" in commands
