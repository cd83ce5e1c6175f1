"""``pip`` as a docs example meets it in the suite: ``pip install …`` checks that what it names is
already satisfied here (the checkout's placeholder path, its extras, the packages besides it)
and installs nothing, so an install line that names a missing extra or a package the
environment lacks fails, and the suite's venv is never changed. Every other pip command fails.

Run as ``python -m tests.support.pip_check install …`` (a ``pip`` on the examples' PATH).
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# how the docs write "this checkout": the placeholder paths and the wheel built from it
CHECKOUT = re.compile(r"^(?:/path/to/(?:checkout|toolseam)|dist/toolseam-[^/\[]*\.whl)(?:\[(.*)\])?$")
NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[(.*)\])?$")


def _requirement_name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]


def missing(requirement: str) -> list[str]:
    """What of ``requirement`` (as written after ``pip install``) is not satisfied here."""
    extras_table = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    if checkout := CHECKOUT.match(requirement):
        wanted = [e for e in (checkout[1] or "").split(",") if e]
        unknown = [f"toolseam has no extra {e!r}" for e in wanted
                   if e not in extras_table["optional-dependencies"]]
        needs = [r for e in wanted for r in extras_table["optional-dependencies"].get(e, [])]
        needs += extras_table["dependencies"]
        return unknown + [n for r in needs if (n := _requirement_name(r)) != "toolseam"
                          and not _installed(n)]
    if name := NAME.match(requirement):
        return [] if _installed(name[1]) else [name[1]]
    return [f"not a requirement this check understands: {requirement!r}"]


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "install":
        print(f"pip_check: only 'pip install' is checked, not {argv[:1]}", file=sys.stderr)
        return 2
    requirements = [a for a in argv[1:] if not a.startswith("-")]
    problems = [p for r in requirements for p in missing(r)]
    for problem in problems:
        print(f"pip_check: {problem}", file=sys.stderr)
    return 1 if problems or not requirements else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
