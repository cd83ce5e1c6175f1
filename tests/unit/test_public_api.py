"""The public surface: __all__ is exact, and the distribution installs two top-level packages:
``toolseam`` and the in-sandbox agent, ``toolseam_agent``."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import toolseam
import toolseam.seam
import toolseam_agent


def test_all_names_exist_and_nothing_public_is_missing() -> None:
    for module in (toolseam, toolseam.seam):
        for name in module.__all__:
            assert hasattr(module, name), name
        public = {n for n in dir(module) if not n.startswith("_")
                  and not isinstance(getattr(module, n), type(importlib))}
        assert public - set(module.__all__) - {"annotations"} == set(), module.__name__


def test_only_toolseam_and_its_agent_are_installed_at_top_level() -> None:
    config = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert config["tool"]["setuptools"]["packages"]["find"]["include"] == [
        "toolseam", "toolseam.*", "toolseam_agent"]
    top = {p.name for p in Path(toolseam.__file__).parent.iterdir() if p.is_dir()
           and (p / "__init__.py").exists()}
    assert {"seam", "backends", "listing", "builtins", "policy", "testing"} <= top


def test_the_agent_imports_only_the_standard_library() -> None:
    import ast
    import sys

    agent = Path(toolseam_agent.__file__).parent
    for source in agent.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] in sys.stdlib_module_names, (source, node.module)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in sys.stdlib_module_names, (source, alias.name)
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                raise AssertionError(f"{source} reaches outside the agent package")
