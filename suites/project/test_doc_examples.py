"""Every example of the documentation is run or checked (the README and every ``docs/*.md``, found
when the tests run, so a new page is checked as soon as it exists).

Why: an example that no longer runs teaches the wrong thing, and a page that names a flag, a target
or a file that is gone sends the reader nowhere.

Run for real, each by the test in the tier of its subject (``RUN_FOR_REAL`` below; a test here
keeps the list true):

- the scaler's training loop and ``ShardedOptimizer`` (README, ``docs/scaler.md``), on 2 gloo ranks:
  ``suites/scaler/test_doc_examples.py`` (``make test``);
- the harness's ``@harness.distributed`` tests and its ``DistributedTestCase`` class, in an inner
  pytest session, and the one-machine torchrun command (``docs/harness.md``):
  ``suites/harness/test_doc_examples.py`` (``make e2e``);
- ``test_my_model.py`` (``@parity_test``) with its ``pytest`` command, and the CLI's ``--list``
  command (README, ``docs/your-model.md``): ``suites/parity/test_doc_examples.py`` (``make e2e``);
- the Hugging Face workload and its resume check, each module with its command:
  ``suites/models/test_doc_hf_example.py`` and ``test_doc_hf_resume.py`` (``make e2e``); the FSDP2 +
  TP workload with its command: ``suites/models/test_doc_tp_example.py`` (``make two-d``).

Checked here, cheaply, for every example on every page (``make test``):

- every python block compiles; what it imports from the project exists; its calls of project
  names (``Workload(...)``, ``parity_test(...)``, ``ShardedOptimizer(...)``) bind to their
  signatures;
- every command of a shell block is one this test knows how to check, and is checked:
  ``python -m harness.parity ...`` is parsed by the CLI's own ``parse_args``, which resolves the
  workload and fails when ``-k`` selects nothing (``my_workloads`` is the user's module the suites
  use, ``fixtures/user_workloads.py``; a module only a page defines, such as ``my_hf_workloads``,
  is left to the test that runs it, and its flags are parsed); the other modules' commands (``ci.gate``,
  ``ci.kernels``, ``ci.mutation``, ``ci.bench``, ``harness.frontends.torchrun``, ``scaler.demo``) by
  their argument parsers; ``torchrun`` by torch's; ``pytest`` by pytest's, with the project's
  plugins; ``make TARGET VAR=value`` by ``make -n`` (a real target, variables the Makefile
  declares), and the commands it would run are checked as above;
- in the prose: every ``make ...``, ``python -m ...``, ``torchrun ...`` and ``pytest ...`` span
  as above (only names, where it holds a placeholder such as ``N``), every ``--flag`` span is a
  flag of one of those parsers, and every span that is a path of the project exists;
- every TOML block parses, and an entry-point table names the group the registry reads;
- every relative link leads to a page that exists and, with ``#anchor``, to one of its headings;
- the README is a front door: under 300 lines, linking every page of ``docs/``.

The output blocks (reports, summaries, no language) are read by no test: they are excerpts.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from suites import doc_pages
from suites.doc_pages import ROOT, Block

RUN_FOR_REAL = [
    # (page, a line of the block, the test that runs the block for real)
    ("README.md", "for inputs, target in data:", "suites/scaler/test_doc_examples.py"),
    ("docs/scaler.md", "for inputs, target in data:", "suites/scaler/test_doc_examples.py"),
    (
        "docs/scaler.md",
        "from scaler import ShardedGradScaler, ShardedOptimizer",
        "suites/scaler/test_doc_examples.py",
    ),
    (
        "docs/harness.md",
        "def test_fixture_style(ranks):  # the `ranks` fixture",
        "suites/harness/test_doc_examples.py",
    ),
    (
        "docs/harness.md",
        "class TestSum(harness.DistributedTestCase):  # before: class TestSum(MultiProcessTestCase):",
        "suites/harness/test_doc_examples.py",
    ),
    (
        "docs/harness.md",
        ".venv/bin/torchrun --standalone --nproc-per-node 2 -m harness.frontends.torchrun suites/harness/test_distributed.py",
        "suites/harness/test_doc_examples.py",
    ),
    ("README.md", "# test_my_model.py", "suites/parity/test_doc_examples.py"),
    ("docs/your-model.md", "# test_my_model.py", "suites/parity/test_doc_examples.py"),
    (
        "docs/your-model.md",
        "pytest test_my_model.py -k 'fsdp2 and bf16' --junitxml=junit.xml",
        "suites/parity/test_doc_examples.py",
    ),
    (
        "docs/your-model.md",
        "python -m harness.parity --workload my_workloads:resmlp -k 'fsdp2 and bf16' --list",
        "suites/parity/test_doc_examples.py",
    ),
    ("docs/your-model.md", "# my_hf_workloads.py", "suites/models/test_doc_hf_example.py"),
    ("docs/your-model.md", "# my_hf_resume.py", "suites/models/test_doc_hf_resume.py"),
    ("docs/your-model.md", "# my_tp_workloads.py", "suites/models/test_doc_tp_example.py"),
]
"""The examples a test runs for real; the block holding each line is read out of its page there."""

PROJECT = ("harness", "scaler", "ci", "fixtures", "suites", "docs")
"""The top folders of the checkout a path in the prose may start with."""

NOT_YET = {"ci/baselines/nccl/"}
"""Paths the pages tell the reader to make (the GPU baselines, recorded on a GPU runner)."""

PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_]*|[a-z]+\|[a-z|]+)$")
"""A word standing for what the reader fills in: ``N``, ``NAME``, ``DIR``, ``every|last``."""

# --------------------------------------------------------------------------- argument parsers
ENTRY_POINTS: dict[str, str] = {
    "harness.parity": "harness.parity.__main__:parse_args",
    "harness.frontends.torchrun": "harness.frontends.torchrun:main",
    "ci.gate": "ci.gate.cli:parse_args",
    "ci.kernels": "ci.kernels.__main__:parse_args",
    "ci.mutation": "ci.mutation.__main__:parse_args",
    "ci.bench": "ci.bench.__main__:main",
    "scaler.demo": "scaler.demo:parse_args",
}
"""Each ``python -m`` module of the project a page may run, and the function that parses its arguments."""

BUILT_IN_OR_SUITES = re.compile(r"^(?:[a-z0-9_]+|my_workloads:\w+)$")
"""The ``--workload`` values the CLI's own ``parse_args`` resolves here: a registered name, or the
user's ``my_workloads`` (the suites' ``fixtures/user_workloads.py``)."""


class _Parsed(Exception):
    """Raised in place of ``ArgumentParser.parse_args`` to hand the parser over."""


class _ParseError(Exception):
    """What ``ArgumentParser.error`` would have printed before exiting."""


def _function(dotted: str) -> Callable[..., object]:
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def parser_of(module: str) -> argparse.ArgumentParser:
    """The argument parser ``python -m module`` builds, caught as it is about to parse."""

    def hand_over(self, *args, **kwargs):
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", hand_over):
        try:
            _function(ENTRY_POINTS[module])([])
        except _Parsed as parsed:
            return parsed.args[0]
    raise AssertionError(f"{ENTRY_POINTS[module]} returned without parsing its arguments")


def _torchrun_parser() -> argparse.ArgumentParser:
    from torch.distributed.run import get_args_parser

    return get_args_parser()


@contextlib.contextmanager
def _errors_raise(parser: argparse.ArgumentParser) -> Iterator[None]:
    def error(message):
        raise _ParseError(f"{parser.prog}: {message}")

    with mock.patch.object(parser, "error", error):
        yield


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    return {module: parser_of(module) for module in ENTRY_POINTS}


@pytest.fixture
def users_folder(monkeypatch):
    """The user's ``my_workloads`` importable, as from the folder that holds it; undone afterwards
    (``sys.path``, ``sys.modules`` and the registry's cache)."""
    from fixtures import user_workloads
    from harness.parity.workload import registry

    monkeypatch.syspath_prepend(str(ROOT))  # parse_args adds the current folder: undone with this
    monkeypatch.setitem(sys.modules, "my_workloads", user_workloads)
    yield
    registry.resolve.cache_clear()
    registry.fused_optimizer.cache_clear()


# ---------------------------------------------------------------------------------- commands
def _make_targets() -> list[str]:
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line.split()[0] for line in out.stdout.splitlines()[1:]]


def _make_variables() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^(?:export\s+)?([A-Z][A-Z0-9_]*)\s*[?:]?=", text, flags=re.M))


class Checker:
    """Checks one command as a reader would type it; ``full`` when it is an example to copy (a
    shell block), else a mention in the prose, whose placeholders are only names."""

    def __init__(self, parsers, pytestconfig, targets, variables):
        self.parsers, self.pytestconfig = parsers, pytestconfig
        self.targets, self.variables = targets, variables
        self.checked: set[tuple[str, bool]] = set()

    def check(self, command: str, *, full: bool) -> None:
        if (command, full) in self.checked:
            return
        words = shlex.split(command)
        while words and re.match(r"^[A-Z_]+=", words[0]):  # an environment prefix
            words = words[1:]
        program = Path(words[0]).name
        if len(words) == 1 and program != "make" and not full:
            return  # a program's name, in the prose
        placeholders = not full and any(PLACEHOLDER.match(w.split("=", 1)[-1]) for w in words[1:])
        if program == "make":
            self.make(words[1:], placeholders=placeholders)
        elif program in ("python", "python3"):
            assert words[1:2] == ["-m"], f"{command}: run the project's modules with python -m"
            self.module(words[2], words[3:], full=full and not placeholders)
        elif program == "torchrun" and "..." in words and not full:  # torchrun's own flags elided
            self.module(words[words.index("-m") + 1], [], full=False)
        elif program == "torchrun":
            with _errors_raise(parser := _torchrun_parser()):
                options = parser.parse_args(words[1:])
            assert options.module, f"{command}: torchrun runs the project's modules with -m"
            self.module(options.training_script, options.training_script_args, full=full)
        elif program == "pytest":
            self.pytest(words[1:])
        elif program == "git":
            pass  # git's own commands (git diff ci/baselines)
        else:
            raise AssertionError(f"{command}: a command this test cannot check; teach Checker.check")
        for word in words:
            self.path(word.split("::")[0].split("=")[-1])
        self.checked.add((command, full))

    def make(self, words: list[str], *, placeholders: bool) -> None:
        target, assignments = words[0], words[1:]
        assert target in self.targets, f"make {target}: no such target (make help: {self.targets})"
        names = [a.split("=", 1)[0] for a in assignments]
        assert set(names) <= self.variables, f"make {target}: no such variable {set(names) - self.variables}"
        if placeholders:
            return
        dry = subprocess.run(
            ["make", "-n", "-s", *words], cwd=ROOT, capture_output=True, text=True, timeout=60
        )
        assert dry.returncode == 0, dry.stderr
        for line in dry.stdout.splitlines():
            found = re.search(r"\S*python\S* -m ((?:harness|ci|scaler)\.[\w.]+|pytest)\b(.*)$", line)
            if found:
                self.module(found.group(1), shlex.split(found.group(2)), full=True)

    def module(self, module: str, args: list[str], *, full: bool) -> None:
        if module == "pytest":
            return self.pytest(args)
        if module not in ENTRY_POINTS:
            assert importlib.util.find_spec(module), f"python -m {module}: no such module"
            return
        if not args and not full:
            return  # the module's name, in the prose
        if module == "harness.parity" and full and self.resolvable(args):
            with _errors_raise_any():
                _function(ENTRY_POINTS[module])(args)
            return
        parser = self.parsers[module]
        with _errors_raise(parser):
            parser.parse_args(args)

    @staticmethod
    def resolvable(args: list[str]) -> bool:
        workloads = [args[i + 1] for i, word in enumerate(args[:-1]) if word == "--workload"]
        return all(BUILT_IN_OR_SUITES.match(w) for w in workloads)

    def pytest(self, args: list[str]) -> None:
        _, unknown = _pytest_parser(self.pytestconfig).parse_known_and_unknown_args(args)
        flags = [word for word in unknown if word.startswith("-")]
        assert flags == [], f"pytest {shlex.join(args)}: pytest does not know {flags}"

    @staticmethod
    def path(word: str) -> None:
        if re.match(rf"^(?:{'|'.join(PROJECT)})/[\w./-]*$", word) and "*" not in word:
            assert (ROOT / word).exists(), f"{word}: no such file or folder in the checkout"


def _pytest_parser(pytestconfig: pytest.Config):
    """pytest's own parser, with every plugin's options (the project's included): pytest keeps it
    private, and it is the one this session's arguments went through."""
    return pytestconfig._parser


def _pytest_knows(pytestconfig: pytest.Config, flag: str) -> bool:
    try:
        _, unknown = _pytest_parser(pytestconfig).parse_known_and_unknown_args([flag])
    except (pytest.UsageError, SystemExit):
        return True  # a flag pytest knows, which wants a value
    return flag not in unknown


@contextlib.contextmanager
def _errors_raise_any() -> Iterator[None]:
    """``parser.error`` of any parser built inside raises, with argparse's message."""

    def error(self, message):
        raise _ParseError(f"{self.prog}: {message}")

    with mock.patch.object(argparse.ArgumentParser, "error", error):
        yield


@pytest.fixture(scope="module")
def checker(parsers, pytestconfig) -> Checker:
    return Checker(parsers, pytestconfig, _make_targets(), _make_variables())


SHELL = [block for block in doc_pages.all_blocks("bash", "sh", "shell")]


@pytest.mark.parametrize("block", SHELL, ids=[b.where for b in SHELL])
def test_every_command_of_a_shell_example_is_checked(block: Block, checker, users_folder):
    commands = doc_pages.commands(block)
    assert commands, f"{block.where}: a shell block without a command"
    for command in commands:
        try:
            checker.check(command, full=True)
        except (_ParseError, SystemExit) as error:
            raise AssertionError(f"{block.where}: {command}\n{error}") from None


COMMAND_SPAN = re.compile(r"^(?:make |python3? -m |\.venv/bin/python -m |torchrun |pytest )")


@pytest.mark.parametrize("page", doc_pages.pages(), ids=str)
def test_every_command_the_prose_names_is_checked(page: Path, checker, users_folder):
    spans = [span for span in doc_pages.inline_code(page) if COMMAND_SPAN.match(span)]
    for span in spans:
        try:
            checker.check(span, full=False)
        except (_ParseError, SystemExit) as error:
            raise AssertionError(f"{page}: `{span}`\n{error}") from None


@pytest.mark.parametrize("page", doc_pages.pages(), ids=str)
def test_every_flag_the_prose_names_is_a_real_flag(page: Path, parsers, pytestconfig):
    known = set().union(*map(_flags, parsers.values()), _flags(_torchrun_parser()))
    spans = [span for span in doc_pages.inline_code(page) if re.match(r"^--[a-z]", span)]
    unknown = []
    for span in spans:
        flag = span.split()[0].split("=")[0]
        if flag not in known and not _pytest_knows(pytestconfig, flag):
            unknown.append(span)
    assert unknown == [], f"{page} names flags that no command of the project takes"


@pytest.mark.parametrize("page", doc_pages.pages(), ids=str)
def test_every_path_the_prose_names_exists(page: Path):
    gone = [
        span
        for span in doc_pages.inline_code(page)
        if re.match(rf"^(?:{'|'.join(PROJECT)})/[\w./-]*$", span)
        and not (ROOT / span).exists()
        and span not in NOT_YET
    ]
    assert gone == [], f"{page} names files that are not in the checkout"


PYTHON = doc_pages.all_blocks("python")


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_every_python_example_compiles_and_calls_what_exists(block: Block):
    compile(block.code, block.where, "exec")
    tree = ast.parse(block.code)
    names: dict[str, object] = {}  # what the example binds to the project's modules and objects
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PROJECT:
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block.where}: {node.module} has no {alias.name}"
                names[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PROJECT:
                    names[alias.asname or alias.name] = importlib.import_module(alias.name)

    def resolve(node: ast.expr) -> object | None:
        """The project object ``node`` names (``Workload``, ``harness.distributed``), else None."""
        if isinstance(node, ast.Name):
            return names.get(node.id)
        if isinstance(node, ast.Attribute) and (owner := resolve(node.value)) is not None:
            assert hasattr(owner, node.attr), f"{block.where}, line {node.lineno}: no {node.attr} in {owner}"
            return getattr(owner, node.attr)
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            resolve(node)
        if isinstance(node, ast.Call) and callable(target := resolve(node.func)):
            positional = [None] * len(node.args)
            keywords = {kw.arg: None for kw in node.keywords if kw.arg is not None}
            try:
                inspect.signature(target).bind_partial(*positional, **keywords)
            except TypeError as error:
                raise AssertionError(
                    f"{block.where}, line {node.lineno}: {ast.unparse(node.func)}: {error}"
                ) from None


TOML = doc_pages.all_blocks("toml")


@pytest.mark.parametrize("block", TOML, ids=[b.where for b in TOML])
def test_every_toml_example_parses_and_names_the_registry_group(block: Block):
    from harness.parity.workload.registry import ENTRY_POINT_GROUP

    tomllib = pytest.importorskip("tomllib", reason="reading TOML needs Python 3.11's tomllib")
    data = tomllib.loads(block.code)
    groups = data.get("project", {}).get("entry-points", {})
    assert ENTRY_POINT_GROUP in groups, f"{block.where}: not the group the registry reads"
    assert all(re.match(r"^[\w.]+:\w+$", spec) for spec in groups[ENTRY_POINT_GROUP].values())


def test_every_block_has_a_language_or_is_output():
    """A block without a language is an output (a report, a summary) and no test reads it; a
    command or code is marked ``bash`` or ``python`` so that the tests above find it."""
    unmarked = [
        block.where
        for block in doc_pages.all_blocks("")
        if re.match(r"^(?:\$ |make |python|pytest |torchrun |from |import )", block.code)
    ]
    assert unmarked == []


@pytest.mark.parametrize("page", doc_pages.pages(), ids=str)
def test_every_link_leads_to_a_page_and_a_heading(page: Path):
    broken = []
    for text, target in re.findall(r"\[([^\]]+)\]\(([^)\s]+)\)", doc_pages.prose(page)):
        if re.match(r"^[a-z]+:", target):
            continue  # another site
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        resolved = (ROOT / linked).resolve()
        if not resolved.exists():
            broken.append(f"[{text}]({target}): no such file")
        elif anchor and anchor not in doc_pages.anchors(resolved.relative_to(ROOT)):
            broken.append(f"[{text}]({target}): no heading with that anchor in {linked}")
    assert broken == [], f"{page} has links that lead nowhere"


def test_the_readme_is_a_front_door_to_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300, "the README is a front door; move the rest to a page of docs/"
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if f"](docs/{p.name})" not in readme]
    assert unlinked == [], "the README's 'Where to read on' links every page of docs/"


@pytest.mark.parametrize(
    "page, line, test", RUN_FOR_REAL, ids=[f"{p}:{line[:40]}" for p, line, _ in RUN_FOR_REAL]
)
def test_the_examples_said_to_run_are_run_by_their_test(page, line, test):
    holding = [b for b in doc_pages.blocks(Path(page)) if line in b.code.splitlines()]
    assert len(holding) == 1, f"{page}: {len(holding)} blocks hold {line!r}, not one"
    source = (ROOT / test).read_text()
    assert "doc_pages" in source, f"{test} does not read the pages"
    assert page in source or "all_blocks" in source, f"{test} does not read {page}"
    module = re.match(r"^# (\w+)\.py", line)
    assert module is None or module.group(1) in source, f"{test} does not run {module.group(1)}.py"
