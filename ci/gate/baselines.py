"""Golden curves: one CSV file per backend and torch version, and how the gate picks one.

Layout: ``ci/baselines/<backend>/torch-<major>.<minor>.<patch>.csv``. Each file holds, for every
parity configuration the tier runs, the candidate run's per-step curves, one row per configuration
and step::

    # comment lines (what wrote the file)
    configuration,step,scale,grad_norm,loss
    fsdp1-full_shard-flat-fp32-sgd-w2,0,65536.0,1.9372463226318359,2.302585124969482 2.3025853633880615

``loss`` holds every rank's loss, space-separated, in rank order. Numbers are written as Python
writes them (the shortest text that reads back to the same float; ``inf``/``nan`` as such), so a
file read back is exactly the run that wrote it, and a pull request that changes a curve shows
each changed step as one changed line naming its configuration.

Why keyed by torch version: the numbers come from torch's kernels, so another torch may move the
last digits (or more) without any change of ours. The gate compares against the file of the
running torch's own version when there is one; otherwise against the *nearest* version's file, and
then calls every difference *drift* rather than a regression (see :func:`choose`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

HEADER = ("configuration", "step", "scale", "grad_norm", "loss")
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_FILE = re.compile(r"^torch-(\d+\.\d+\.\d+)\.csv$")


class BaselineError(ValueError):
    """A baseline file or folder is missing or malformed (the message names the file and the fix)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StepPoint:
    """One step of one configuration's golden curves."""

    step: int
    scale: float
    grad_norm: float
    loss: tuple[float, ...]
    """By rank."""


Curves = dict[str, list[StepPoint]]
"""``{configuration id: points by step}``."""


def torch_version(text: str) -> tuple[int, int, int]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; ``"2.6"`` -> ``(2, 6, 0)``. Local and pre-release
    suffixes are ignored: a CPU and a CUDA build of one release share their baselines."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise BaselineError(f"cannot read a torch version from {text!r}; expected e.g. '2.13.0'")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def version_text(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def path_for(root: Path, backend: str, version: tuple[int, int, int]) -> Path:
    """Where the baselines of ``backend`` under torch ``version`` live."""
    return root / backend / f"torch-{version_text(version)}.csv"


def available(root: Path, backend: str) -> dict[tuple[int, int, int], Path]:
    """The baseline files of ``backend`` under ``root``, by torch version."""
    folder = root / backend
    if not folder.is_dir():
        return {}
    found = {}
    for path in folder.iterdir():
        match = _FILE.match(path.name)
        if match:
            found[torch_version(match.group(1))] = path
    return found


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Choice:
    """The baseline file the gate compares against, and whether differences are drift."""

    path: Path
    version: tuple[int, int, int]
    """The torch version the baselines were recorded with."""
    running: tuple[int, int, int]
    """The torch version of this run."""

    @property
    def exact(self) -> bool:
        """Recorded with this run's torch: a difference is a regression, not drift."""
        return self.version == self.running

    def describe(self) -> str:
        how = (
            "same torch"
            if self.exact
            else f"nearest to torch {version_text(self.running)}: differences are drift"
        )
        try:  # relative to the working folder when inside it: what a CI log reader can open
            shown = self.path.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = self.path
        return f"{shown} (torch {version_text(self.version)}, {how})"


def nearest(
    versions: Iterable[tuple[int, int, int]], running: tuple[int, int, int]
) -> tuple[int, int, int] | None:
    """The version closest to ``running``: the smallest difference of major, then minor, then patch
    version (``2.6`` is nearer ``2.5`` than ``2.13``); a tie goes to the newer version."""
    candidates = list(versions)
    if not candidates:
        return None

    def distance(version: tuple[int, int, int]) -> tuple[int, int, int, tuple[int, int, int]]:
        gaps = tuple(abs(a - b) for a, b in zip(version, running, strict=True))
        return (*gaps, tuple(-part for part in version))  # type: ignore[return-value]

    return min(candidates, key=distance)


def choose(root: Path, backend: str, running: tuple[int, int, int]) -> Choice | None:
    """This torch version's baselines if recorded, else the nearest version's; ``None`` when the
    backend has none at all."""
    files = available(root, backend)
    version = running if running in files else nearest(files, running)
    if version is None:
        return None
    return Choice(path=files[version], version=version, running=running)


# -- reading and writing ----------------------------------------------------------------------------
def _number(text: str, *, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise BaselineError(f"{where}: {text!r} is not a number") from None


def read(path: Path) -> Curves:
    """The curves in ``path`` (see the module docstring for the format)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise BaselineError(f"cannot read baselines {path}: {error.strerror}") from None
    rows = [line for line in text.splitlines() if line and not line.startswith("#")]
    reader = csv.reader(rows)
    header = next(reader, None)
    if header is None or tuple(header) != HEADER:
        raise BaselineError(
            f"{path}: the first row after the comments must be {','.join(HEADER)}, got {header}; "
            "rewrite the file with python -m ci.gate --update-baselines"
        )
    curves: Curves = {}
    for number, row in enumerate(reader, start=2):
        where = f"{path}, row {number}"
        if len(row) != len(HEADER):
            raise BaselineError(f"{where}: expected {len(HEADER)} fields, got {len(row)}: {row}")
        config, step, scale, grad_norm, loss = row
        points = curves.setdefault(config, [])
        point = StepPoint(
            step=int(_number(step, where=where)),
            scale=_number(scale, where=where),
            grad_norm=_number(grad_norm, where=where),
            loss=tuple(_number(value, where=where) for value in loss.split()),
        )
        if point.step != len(points):
            raise BaselineError(f"{where}: {config} step {point.step} follows step {len(points) - 1}")
        points.append(point)
    return curves


def _text(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else str(float(value))


def render(curves: Mapping[str, list[StepPoint]], *, backend: str, version: tuple[int, int, int]) -> str:
    """The file's text; configurations sorted by id, so a rewrite reorders nothing."""
    out = io.StringIO()
    out.write(
        f"# shardscale gate baselines: backend {backend}, torch {version_text(version)}.\n"
        "# The candidate run's curves of every parity configuration, one row per step; loss by rank.\n"
        "# Written by `python -m ci.gate --update-baselines`; review changes like code.\n"
    )
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    for config in sorted(curves):
        for point in curves[config]:
            writer.writerow(
                [
                    config,
                    point.step,
                    _text(point.scale),
                    _text(point.grad_norm),
                    " ".join(_text(value) for value in point.loss),
                ]
            )
    return out.getvalue()


def write(
    path: Path, curves: Mapping[str, list[StepPoint]], *, backend: str, version: tuple[int, int, int]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(curves, backend=backend, version=version))
