"""The import contract (issue 34): layers top to bottom, no upward import, the agent alone,
private modules and private names kept to their own package.

The layers live in ``.importlinter`` (``lint-imports`` reads it); docs/architecture.md draws
them. A private *name* taken from another package (``from ..x import _helper``) is checked
here with ``ast``: import-linter checks modules only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_lint_imports_keeps_every_contract() -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout


def _package(module: str) -> str:
    """A module's package one level below the top (``toolseam.backends``); the top-level
    modules (``toolseam.toolkit``) and ``toolseam_agent`` are each one package."""
    parts = module.split(".")
    if parts[0] == "toolseam" and len(parts) > 1 and (REPO / "toolseam" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_names_taken_across_packages() -> list[str]:
    found = []
    for path in sorted([*(REPO / "toolseam").rglob("*.py"), *(REPO / "toolseam_agent").rglob("*.py")]):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(module, node, path.name == "__init__.py")
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and _package(source) != _package(module):
                    found.append(f"{module}: from {source} import {alias.name}")
    return found


def test_no_private_name_is_taken_across_packages() -> None:
    assert private_names_taken_across_packages() == []


def test_the_check_sees_a_private_name_taken_across_packages(tmp_path: Path) -> None:
    node = ast.parse("from ..policy.settings import _hidden").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _resolve("toolseam.backends.host", node, False) == "toolseam.policy.settings"
    assert _package("toolseam.policy.settings") != _package("toolseam.backends.host")
