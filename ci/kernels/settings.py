"""Kernel families a CPU can be made to use, by environment variables read when torch loads.

| variable | library | values |
|---|---|---|
| ``ATEN_CPU_CAPABILITY`` | ATen's vectorised CPU kernels | ``default``, ``avx2``, ``avx512`` |
| ``MKL_ENABLE_INSTRUCTIONS`` | MKL (matmuls, BLAS) | ``AVX2``, ``AVX512`` |
| ``ONEDNN_MAX_CPU_ISA`` | oneDNN (convolutions) | ``AVX2``, ``AVX512_CORE`` |

A machine cannot go above its own ISA, and ATen ignores a value it does not know or cannot run
(it silently keeps its native kernels), so each setting names what it requires and the tier checks
which capability ATen reports under it before trusting a run.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class KernelSetting:
    """One kernel family: the environment that selects it and what the CPU needs for it."""

    name: str
    env: Mapping[str, str]
    """Variables set for the run (on top of the caller's environment, which is cleared of all three)."""
    requires: frozenset[str] = frozenset()
    """``/proc/cpuinfo`` flags the CPU must have for the setting to mean what it says."""
    aten: str | None = None
    """The capability ``torch.backends.cpu.get_cpu_capability()`` must report (``None``: native)."""
    description: str = ""


VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")

SETTINGS = (
    KernelSetting(name="native", env={}, description="the machine's own kernels"),
    KernelSetting(
        name="mkl-avx2",
        env={"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
        requires=frozenset({"avx2"}),
        description="MKL held to AVX2 (ATen and oneDNN native)",
    ),
    KernelSetting(
        name="aten-default",
        env={"ATEN_CPU_CAPABILITY": "default"},
        aten="DEFAULT",
        description="ATen's scalar (non-vectorised) kernels: reachable on every CPU",
    ),
    KernelSetting(
        name="avx2",
        env={"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
        requires=frozenset({"avx2"}),
        aten="AVX2",
        description="ATen, MKL and oneDNN all held to AVX2",
    ),
)
BY_NAME = {setting.name: setting for setting in SETTINGS}


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` is missing: only ``native`` and
    ``aten-default`` then count as reachable)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def resolve(names: Iterable[str] | None) -> list[KernelSetting]:
    """The settings called ``names`` (all of them for ``None``); an unknown name is a ``ValueError``
    listing the known ones."""
    if names is None:
        return list(SETTINGS)
    chosen = []
    for name in names:
        if name not in BY_NAME:
            raise ValueError(f"--settings: unknown kernel setting {name!r}; choose from {', '.join(BY_NAME)}")
        chosen.append(BY_NAME[name])
    return chosen


def unreachable_reason(setting: KernelSetting, flags: frozenset[str]) -> str | None:
    """Why ``setting`` cannot run on a CPU with ``flags`` (``None`` when it can)."""
    missing = sorted(setting.requires - flags)
    if missing:
        return f"this CPU lacks {', '.join(missing)}; a machine cannot go above its own ISA"
    return None


def environment(setting: KernelSetting, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the three variables replaced by the
    setting's, so a variable the caller exported does not leak into another family's run."""
    env = {
        key: value for key, value in (os.environ if base is None else base).items() if key not in VARIABLES
    }
    env.update(setting.env)
    return env


def aten_capability(env: Mapping[str, str]) -> str:
    """The capability ATen reports in a fresh interpreter with ``env`` (``AVX512``, ``AVX2``,
    ``DEFAULT``, ...)."""
    completed = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        env=dict(env),
        capture_output=True,
        text=True,
        check=True,
    )
    return completed.stdout.strip().splitlines()[-1]
