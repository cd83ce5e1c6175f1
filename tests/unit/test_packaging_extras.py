"""Every third-party module the inspect provider imports is declared by its extra (issue 33,
item 8: ``yaml`` was imported for YAML configs and declared nowhere)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
# import name -> distribution name, for the provider's third-party imports
DISTRIBUTIONS = {"yaml": "pyyaml", "inspect_ai": "inspect-ai"}


def test_the_inspect_extra_declares_what_the_provider_imports() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["inspect"]
    declared = {spec.split(">")[0].split("=")[0].split("[")[0].strip().lower() for spec in extra}
    imported: set[str] = set()
    for source in (ROOT / "toolseam" / "frontends" / "inspect").glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    needed = {DISTRIBUTIONS[name] for name in imported if name in DISTRIBUTIONS}
    assert "pyyaml" in needed and needed <= declared, (needed, declared)
