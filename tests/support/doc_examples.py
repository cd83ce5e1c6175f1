"""The runnable examples of README.md and docs/: fenced ``python``/``py`` and ``sh``/``bash``/
``console`` blocks, with what the markdown says about each in an HTML comment on the line
before the fence (invisible when rendered):

* ``<!-- example: skip (reason) -->`` — not run here; the reason is required and printed.
* ``<!-- example: continues -->`` — a fragment: run after the previous block of the same
  language in the same file (that block still runs alone as well).
* ``<!-- example: server -->`` — a shell block whose last command serves until stopped: it
  must still be running after a few seconds, then it is stopped.

A block that names an engine (podman, docker) outside its comments needs that engine.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python": "python", "py": "python", "sh": "shell", "bash": "shell",
             "console": "shell"}
FENCE = re.compile(r"^```([A-Za-z]*)[ \t]*$")
DIRECTIVE = re.compile(r"^<!--\s*example:\s*(.*?)\s*-->$")
SKIP = re.compile(r"^skip\s*\((.+)\)$")
ENGINE = re.compile(r"\b(podman|docker)", re.I)


class DirectiveError(ValueError):
    """An ``<!-- example: … -->`` comment the runner does not understand."""


@dataclass(frozen=True)
class DocExample:
    """One fenced block, where it is and how to run it."""

    where: str  # "docs/pool.md:9": the fence's line
    tag: str  # the fence's language tag as written ("py", "console" …)
    language: str  # "python" or "shell"
    code: str  # what runs: the block, after the blocks it continues
    skip: str | None = None  # the reason given in the markdown
    server: bool = False
    continues: bool = False

    @property
    def engine(self) -> str | None:
        """The engine the block names outside its comments ("podman", "docker"), if any; the
        suite's conftest marks such a case ``engines``."""
        found = ENGINE.search(_without_comments(self.language, self.code))
        return found[1].lower() if found else None


def _without_comments(language: str, code: str) -> str:
    if language == "shell":
        return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in code.splitlines())
    try:
        tokens = tokenize.generate_tokens(io.StringIO(code).readline)
        return " ".join(t.string for t in tokens if t.type != tokenize.COMMENT)
    except (tokenize.TokenError, SyntaxError):
        return code


def _directive(text: str, where: str) -> dict[str, object]:
    if text == "continues":
        return {"continues": True}
    if text == "server":
        return {"server": True}
    if skip := SKIP.match(text):
        return {"skip": skip[1].strip()}
    raise DirectiveError(f"{where}: unknown example directive {text!r} (skip (reason), "
                         "continues, server)")


def page_examples(page: Path) -> list[DocExample]:
    """The runnable blocks of one page, in order."""
    lines = page.read_text().splitlines()
    found: list[DocExample] = []
    last: dict[str, str] = {}  # language -> the code of its previous block on this page
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence or not fence[1]:
            index += 1
            continue
        start = index
        end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
        index = end + 1
        language = LANGUAGES.get(fence[1])
        if language is None:
            continue
        where = f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}:{start + 1}"
        code = "\n".join(lines[start + 1:end]) + "\n"
        if fence[1] == "console":  # commands are the "$ " lines; the rest is their output
            code = "".join(line[2:] + "\n" for line in code.splitlines() if line.startswith("$ "))
        before = lines[start - 1].strip() if start else ""
        options = _directive(m[1], where) if (m := DIRECTIVE.match(before)) else {}
        if options.get("continues"):
            if language not in last:
                raise DirectiveError(f"{where}: continues, but no {language} block comes before")
            code = last[language] + code
        last[language] = code
        found.append(DocExample(where, fence[1], language, code, **options))  # type: ignore[arg-type]
    return found


def all_examples() -> list[DocExample]:
    return [example for page in PAGES for example in page_examples(page)]
