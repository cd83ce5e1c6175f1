"""The shape issue 20 asked for, kept: checked on the sources, so a regression is a test failure."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("toolseam/**/*.py"), *ROOT.glob("toolseam_agent/*.py")])


def _hits(pattern: str) -> list[str]:
    found = re.compile(pattern)
    return [f"{p.relative_to(ROOT)}:{n}" for p in SOURCES
            for n, line in enumerate(p.read_text().splitlines(), 1) if found.search(line)]


def test_no_sys_path_patching() -> None:
    assert _hits(r"sys\.path\.(insert|append)") == []


def test_no_private_sdk_name() -> None:
    assert _hits(r"_create_container_args|api\._url|api\._version|api\._raise_for_status") == []


def test_no_workspace_mode_string_tested_outside_the_mode_modules() -> None:
    hits = _hits(r"""(==|!=)\s*["'](bind|copy)["']|["'](bind|copy)["']\s*(==|!=)""")
    assert hits == []


def test_no_engine_error_told_apart_by_its_message() -> None:
    engine = [p for p in SOURCES if "backends/containers" in str(p) and p.name != "pull.py"]
    said = re.compile(r"(not found|no such|connection)\"\s+(not\s+)?in\s")
    assert [p.name for p in engine if said.search(p.read_text())] == []
