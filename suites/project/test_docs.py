"""The project documents itself: `make help` and the README's target table are one list, no file
refers to documents outside the project, and every section of docs/architecture.md the code cites
exists. (Each page's examples: test_doc_examples.py; the architecture's map: test_architecture_map.py.)"""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _help_lines():
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line.strip().split(None, 1) for line in out.stdout.splitlines()[1:]]


def test_make_help_lists_every_target_with_one_line():
    targets = [name for name, _ in _help_lines()]
    assert targets == [
        "help",
        "setup",
        "parity",
        "test",
        "e2e",
        "world-sizes",
        "reshard",
        "two-d",
        "pipeline",
        "property",
        "compile",
        "models",
        "test-gpu",
        "gate",
        "kernels",
        "mutation",
        "bench",
        "demo",
        "lint",
        "clean",
    ]


def test_the_readme_target_table_is_make_help():
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| `make ([a-z0-9-]+)` \| (.+) \|$", readme, flags=re.M)
    assert [(name, text) for name, text in rows] == [(name, text) for name, text in _help_lines()]


def test_no_file_refers_to_documents_outside_the_project():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    outside = re.compile(r"\.\./shared|DESIGN\.md|STYLE\.md")
    offenders = [
        name
        for name in tracked
        if (ROOT / name).is_file()
        and outside.search((ROOT / name).read_text(errors="replace"))
        and name != "suites/project/test_docs.py"
    ]
    assert offenders == []


def test_every_architecture_section_cited_in_the_code_exists():
    headings = set(
        re.findall(r"^#+ (\d+(?:\.\d+)*)\.? ", (ROOT / "docs/architecture.md").read_text(), flags=re.M)
    )
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    cited = {
        (name, section)
        for name in tracked
        for section in re.findall(
            r"docs/architecture\.md, sections? ([\d.]+(?: and [\d.]+)?)", (ROOT / name).read_text()
        )
        for section in section.split(" and ")
    }
    assert cited, "expected the code to cite the architecture document"
    assert {(n, s) for n, s in cited if s.rstrip(".") not in headings} == set()
