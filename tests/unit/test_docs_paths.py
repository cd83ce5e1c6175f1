"""The docs name what exists (issue 34): every repository path a page names in backticks
(``toolseam/…``, ``toolseam_agent/…``, ``tests/…``, ``scripts/…``, ``benchmarks/…``,
``images/…``, ``docs/…``) is there — and a test named as ``file::test`` is in that file —, every
module architecture.md's layout names is in the folder it is listed under and every module of
the two packages is named there (issue 47), and every entry of
docs/decisions.md has a status, a superseded one naming an entry that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ..support.paths import REPO

PAGES = sorted([*(REPO / "docs").rglob("*.md"), REPO / "README.md"])
PREFIXES = ("toolseam", "toolseam_agent", "tests", "scripts", "benchmarks", "images", "docs")
NAMED_PATH = re.compile("`((?:" + "|".join(PREFIXES) + r")/[^`\s]*)`")
# a pattern or a placeholder, not a path: `tests/**/*.py`, `images/<name>/`, `docs/{a,b}.md`
NOT_A_PATH = re.compile(r"[*<>{}$]")
LAYOUT_NAME = re.compile(r"(?<![\w./])([A-Za-z_]\w*(?:\.py|/))(?=[\s·),]|$)")
ENTRY = re.compile(r"^(\d+)\. ", re.MULTILINE)
STATUS = re.compile(r"Status:\s+(accepted|superseded\s+by\s+(\d+))")


def named_paths(text: str) -> list[tuple[str, str]]:
    """(path, test name or "") for each backticked repository path in ``text``."""
    found = []
    for match in NAMED_PATH.finditer(text):
        named = match.group(1)
        if NOT_A_PATH.search(named):
            continue
        path, _, test = named.partition("::")
        # `module.py:function` names a place in a file; the file is what must exist
        path = re.sub(r"(\.\w+):[\w.]+$", r"\1", path).rstrip(".,;")
        found.append((path, test.split("[")[0]))
    return found


def layout_modules(text: str) -> list[str]:
    """Each module and subfolder the layout block of architecture.md names, as a repository
    path: a line that starts at the margin is a folder, its text (and the indented lines after
    it) names what is in it."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    named: list[str] = []
    folder = ""
    for line in block.splitlines():
        if line and not line[0].isspace():
            folder, _, line = line.partition(" ")
        named += [folder + name for name in LAYOUT_NAME.findall(line)]
    return named


def decision_entries(text: str) -> dict[int, str]:
    """Each numbered entry of docs/decisions.md, by number (an entry runs to the next one)."""
    starts = list(ENTRY.finditer(text))
    entries: dict[int, str] = {}
    for match, following in zip(starts, [*starts[1:], None], strict=True):
        number = int(match.group(1))
        assert number not in entries, f"decision {number} is numbered twice"
        entries[number] = text[match.start():following.start() if following else len(text)]
    return entries


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_page_names_exists(page: Path) -> None:
    missing = []
    for path, test in named_paths(page.read_text(encoding="utf-8")):
        target = REPO / path
        if not target.exists():
            missing.append(path)
        elif test and not re.search(rf"def {re.escape(test)}\b", target.read_text()):
            missing.append(f"{path}::{test}")
    assert not missing, f"{page.relative_to(REPO)} names what does not exist: {missing}"


def test_every_module_the_layout_names_exists() -> None:
    named = layout_modules((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert len(named) > 100
    missing = [path for path in named if not (REPO / path).exists()]
    assert not missing, f"docs/architecture.md's layout names what does not exist: {missing}"


def unnamed_modules(named: list[str], root: Path) -> list[str]:
    """Each module of ``toolseam/`` and ``toolseam_agent/`` below ``root`` (a package's
    ``__init__.py`` aside) that a layout naming ``named`` leaves out."""
    return [path for top in ("toolseam", "toolseam_agent")
            for module in sorted((root / top).rglob("*.py")) if module.name != "__init__.py"
            if (path := str(module.relative_to(root))) not in set(named)]


def test_every_module_of_the_packages_is_in_the_layout() -> None:
    named = layout_modules((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    missing = unnamed_modules(named, REPO)
    assert not missing, ("docs/architecture.md's layout leaves out these modules; name each "
                         f"under its folder's line, with a few words of what it is: {missing}")


def test_the_layout_check_sees_a_module_left_out(tmp_path: Path) -> None:
    for module in ("toolseam/seam/protocol.py", "toolseam/seam/__init__.py",
                   "toolseam/seam/new.py", "toolseam_agent/main.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).touch()
    named = layout_modules("## Layout\n```\ntoolseam/seam/  protocol.py\n"
                           "toolseam_agent/  main.py\n```\n")
    assert unnamed_modules(named, tmp_path) == ["toolseam/seam/new.py"]


def test_every_decision_has_a_status_and_a_successor_that_exists() -> None:
    entries = decision_entries((REPO / "docs" / "decisions.md").read_text(encoding="utf-8"))
    assert len(entries) > 100
    without = [n for n, entry in entries.items() if not STATUS.search(entry)]
    assert not without, ("decisions without a 'Status: accepted' or 'Status: superseded by N' "
                         f"line: {without}")
    dangling = {n: int(m.group(2)) for n, entry in entries.items()
                if (m := STATUS.search(entry)) and m.group(2) and int(m.group(2)) not in entries}
    assert not dangling, f"superseded by an entry that does not exist: {dangling}"


def test_the_checks_catch_what_they_are_for() -> None:
    text = ("see `tests/unit/nowhere.py`, `toolseam/seam/protocol.py:BuiltinExec`, "
            "`tests/**/*.py` and `tests/unit/test_docs_paths.py::test_x[a]`")
    assert named_paths(text) == [("tests/unit/nowhere.py", ""), ("toolseam/seam/protocol.py", ""),
                                 ("tests/unit/test_docs_paths.py", "test_x")]
    layout = "## Layout\n```\ntoolseam/seam/  protocol.py (THE) · gone.py\n  sub/ and words\n```\n"
    assert layout_modules(layout) == ["toolseam/seam/protocol.py", "toolseam/seam/gone.py",
                                      "toolseam/seam/sub/"]
    entries = decision_entries("1. **A.** Status: accepted.\n2. **B.**\n   more\n"
                               "3. **C.** Status: superseded by 1.\n")
    assert [n for n, e in entries.items() if not STATUS.search(e)] == [2]
    assert entries[2] == "2. **B.**\n   more\n"
