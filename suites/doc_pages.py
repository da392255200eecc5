"""The documentation read as data, for the tests that run or check its examples (not collected).

The pages are ``README.md`` and every ``docs/*.md``, found when the tests run, so a new page is
checked as soon as it exists. A page's examples are its fenced code blocks; its prose refers to
commands, flags and files in inline code spans (``make kernels``, ``--resume-at K``,
``suites/parity/test_staged.py``), which are read too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pages() -> list[Path]:
    """Every documentation page, relative to the checkout: the README first, then ``docs/``."""
    return [Path("README.md"), *sorted(p.relative_to(ROOT) for p in (ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True, kw_only=True, slots=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    """The page, relative to the checkout."""
    line: int
    """The line of the opening fence (1-based)."""
    lang: str
    """The fence's info string: ``python``, ``bash``, ``toml`` or empty (output, a report)."""
    code: str
    """The lines between the fences."""

    @property
    def where(self) -> str:
        """``page:line``, as a test id and in messages."""
        return f"{self.page}:{self.line}"


_FENCE = re.compile(r"^```(\S*)\s*$")


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page``, in order. An unclosed fence is an error."""
    found, open_at, lang, body = [], None, "", []
    for number, line in enumerate((ROOT / page).read_text().splitlines(), start=1):
        fence = _FENCE.match(line)
        if open_at is None and fence:
            open_at, lang, body = number, fence.group(1), []
        elif open_at is not None and line.strip() == "```":
            found.append(Block(page=page, line=open_at, lang=lang, code="\n".join(body) + "\n"))
            open_at = None
        elif open_at is not None:
            body.append(line)
    assert open_at is None, f"{page}:{open_at}: a code fence is never closed"
    return found


def all_blocks(*langs: str) -> list[Block]:
    """Every page's blocks whose language is one of ``langs``."""
    return [block for page in pages() for block in blocks(page) if block.lang in langs]


def block_starting(page: Path | str, first_line: str) -> Block:
    """The one block of ``page`` whose first line is ``first_line`` (``# my_hf_workloads.py``)."""
    found = [b for b in blocks(Path(page)) if b.code.splitlines()[:1] == [first_line]]
    assert len(found) == 1, f"{page} has {len(found)} code blocks starting with {first_line!r}, not one"
    return found[0]


def commands(block: Block) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block.code)
    found = []
    for line in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            found.append(line)
    return found


def prose(page: Path) -> str:
    """``page`` without its fenced code blocks."""
    text = (ROOT / page).read_text()
    return re.sub(r"^```\S*\s*\n.*?^```\s*$", "", text, flags=re.S | re.M)


def inline_code(page: Path) -> list[str]:
    """The inline code spans of ``page``'s prose, whitespace (line breaks) collapsed to spaces."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose(page))]


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (a repeated heading gets ``-1``, ``-2``, ... as on GitHub)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#+ (.+)$", prose(page), flags=re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found
