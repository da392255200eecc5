"""The pytest plugin's state for one session (or one xdist worker): options, the lazily started
rank pool, where rank logs go, and the words the plugin uses in reports.

Why apart from ``plugin.py``: the hooks there only map pytest's life cycle onto this state; what a
failure report says, where its logs go and how a rank's output reaches pytest's capture live here.
"""

from __future__ import annotations

import re
import shlex
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.outcome import RankResult, Verdict, judge
from harness.spec import DistConfig

if TYPE_CHECKING:  # pytest is imported by whoever uses the state; ``python -m unittest`` needs none
    import pytest

WORKER_OUTPUT_KEY = "shardscale_outlived"
"""Key of an xdist worker's ``workeroutput`` holding what its pool killed at the end."""


class SessionState:
    """Session state: options, the lazily started pool, rank logs, and the leftover-process check."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.deadline_s: float = config.getoption("dist_deadline")
        self.threads: int = config.getoption("rank_threads")
        self.require_gpus: int = config.getoption("require_gpus")
        self._log_root: Path | None = None
        self.pool: Any = None
        self.outlived: dict[str, list[int]] = {}
        """Pids of processes started by ranks that outlived the session and were killed, by where
        the pool ran: ``""`` here, an xdist worker id for a worker's pool (sent at its end)."""
        self._gpus: int | None = None

    def gpus(self) -> int:
        if self._gpus is None:
            import torch

            self._gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return self._gpus

    def get_pool(self) -> Any:
        if self.pool is None:
            from harness.controller.pool import RankPool

            preload = tuple(self.config.getini("shardscale_preload"))
            self.pool = RankPool(threads_per_rank=self.threads, on_output=echo_rank_output, preload=preload)
        return self.pool

    @property
    def log_root(self) -> Path:
        """``--rank-logs`` (relative to where pytest was started), else ``rank-logs`` under pytest's
        basetemp: a failed test's rank logs never land in the user's project by default."""
        if self._log_root is None:
            option = self.config.getoption("rank_logs")
            if option is not None:
                self._log_root = Path(self.config.invocation_params.dir, option)
            else:
                factory = getattr(self.config, "_tmp_path_factory", None)  # pytest's tmp_path plugin
                base = factory.getbasetemp() if factory is not None else Path(tempfile.mkdtemp())
                self._log_root = base / "rank-logs"
        return self._log_root

    def run(
        self, node: pytest.Item, target: str, config: DistConfig, args: tuple, kwargs: dict
    ) -> tuple[Verdict, list[RankResult]]:
        from harness.controller.pool import CaseSpec

        spec = CaseSpec.of(target, config, args=args, kwargs=kwargs, default_deadline_s=self.deadline_s)
        results = self.get_pool().run(spec)
        # What the ranks printed is already in the test's captured output (echo_rank_output).
        return judge(results, world_size=config.world_size, include_output=False), results

    def raise_outcome(self, node: pytest.Item, verdict: Verdict, results: list[RankResult]) -> None:
        """Make ``verdict`` the outcome of the running test: fail (with :meth:`failure_text`), skip
        or xfail it; return if it passed."""
        import pytest

        if verdict.outcome == "failed":
            pytest.fail(self.failure_text(node, verdict, results), pytrace=False)
        if verdict.outcome == "skipped":
            pytest.skip(verdict.message)
        if verdict.outcome == "xfailed":
            pytest.xfail(verdict.message)

    def failure_text(self, node: pytest.Item, verdict: Verdict, results: list[RankResult]) -> str:
        """The verdict, where the rank logs went, and (last line) a command reproducing the test."""
        log_dir = self.log_root / re.sub(r"[^A-Za-z0-9_.-]+", "_", node.nodeid).strip("_")
        log_dir.mkdir(parents=True, exist_ok=True)
        for result in results:
            parts = [f"status: {result.status}", result.text, result.stacks]
            parts += [f"---- stdout ----\n{result.stdout}", f"---- stderr ----\n{result.stderr}"]
            (log_dir / f"rank{result.rank}.log").write_text("\n".join(p.rstrip() for p in parts if p) + "\n")
        return f"{verdict.message}\nrank logs: {log_dir}\n{repro_command(node)}"

    def close(self) -> None:
        """Close the pool (which kills what the ranks left running) and keep what it killed for the
        terminal summary; an xdist worker, whose terminal nobody sees, sends it to the controller."""
        if self.pool is None:
            return
        outlived = list(self.pool.close())
        self.pool = None
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:
            workeroutput[WORKER_OUTPUT_KEY] = outlived
        elif outlived:
            self.outlived[""] = outlived


def echo_rank_output(rank: int, stream: str, text: str) -> None:
    """Write what a rank printed to this process's stdout or stderr, each line labelled
    ``[rank N]``: pytest's capture puts it in the test's "Captured stdout/stderr" sections, and with
    ``-s`` it reaches the terminal while the test runs."""
    target = sys.stdout if stream == "stdout" else sys.stderr
    target.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
    target.flush()


def repro_command(node: pytest.Item) -> str:
    """One line that reruns just this test from anywhere."""
    rootdir = node.config.rootpath
    return (
        f"reproduce: cd {shlex.quote(str(rootdir))} && {sys.executable} -m pytest {shlex.quote(node.nodeid)}"
    )


def gpu_skip_reason(world_size: int, have: int) -> str:
    """Why an NCCL configuration cannot run here, e.g. ``nccl world size 2 needs 2 CUDA GPUs, this
    machine has 0``."""
    gpus = "1 CUDA GPU" if world_size == 1 else f"{world_size} CUDA GPUs"
    return f"nccl world size {world_size} needs {gpus}, this machine has {have}"


def strict_gpu_message(require_gpus: int, reason: str) -> str:
    """``reason`` as a failure of strict GPU mode (``--require-gpus N``)."""
    return f"strict GPU mode (--require-gpus {require_gpus}): {reason}"
