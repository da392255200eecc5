"""``torchrun --nnodes 2 ... -m harness.parity``: two launches on this machine joined by a c10d
rendezvous, as two machines would be (two processes each: world size 4, so HYBRID_SHARD shards
within a "node" and replicates across them). The user's workload lives in a folder outside the
checkout; one of its workloads trains differently when sharded."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

USER_WORKLOADS = Path(__file__).parents[2] / "fixtures" / "user_workloads.py"
SELECTION = "hybrid_shard and orig and fp32 and sgd and suite=fsdp_vs_ddp"

# Two torchrun launches of four ranks in all: `make e2e`.
pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """``(folder, [(exit status, output) of each launch])``."""
    folder = tmp_path_factory.mktemp("two-nodes")
    shutil.copy(USER_WORKLOADS, folder / "my_workloads.py")
    endpoint = f"localhost:{_free_port()}"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "parity-two-nodes",
        "-m", "harness.parity", "--workload", "my_workloads:resmlp",
        "--workload", "my_workloads:l2_outside_forward", "-k", SELECTION, "--no-plot", "--out", "reports",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for _ in range(2)
    ]
    done = []
    for node in nodes:
        output, _ = node.communicate(timeout=300)
        done.append((node.returncode, output))
    return folder, done


def test_every_process_exits_with_the_verdict(launches):
    _, done = launches
    assert [status for status, _ in done] == [1, 1], "\n".join(output for _, output in done)


def test_global_rank_0_alone_reports(launches):
    _, done = launches
    outputs = "\n".join(output for _, output in done)
    assert outputs.count("parity: 2 configurations, gloo, world size 4 (torchrun)") == 1, outputs
    assert outputs.count("parity: 1 configuration(s) broke their tolerance") == 1, outputs


def test_hybrid_shard_across_the_nodes_is_judged_per_workload(launches):
    folder, done = launches
    report = json.loads((folder / "reports" / "parity.json").read_text())
    assert report["run"]["launcher"] == "torchrun" and report["run"]["world_size"] == 4
    statuses = {row["id"]: row["status"] for row in report["configs"]}
    assert statuses == {
        "fsdp1-hybrid_shard-orig-fp32-sgd-resmlp-w4": "pass",
        "fsdp1-hybrid_shard-orig-fp32-sgd-l2_outside_forward-w4": "fail",
    }
