"""Every page in docs/integrations/ runs: its python example, against the real framework from
PyPI, must print exactly what the page says it prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations"
PAGES = sorted(DOCS.glob("*.md"))


def blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), re.M | re.S)


def test_there_is_a_page_per_integration() -> None:
    assert {p.stem for p in PAGES} == {"mcp", "openai-agents", "langchain", "pydantic-ai",
                                       "inspect", "deepagents", "e2b"}


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_example_prints_what_the_page_says(page: Path, tmp_path: Path) -> None:
    """Each python block, run alone, prints the text block that follows it."""
    codes, expected = blocks(page, "python"), blocks(page, "text")
    assert codes and len(codes) == len(expected)
    for number, (code, text) in enumerate(zip(codes, expected, strict=True)):
        script = tmp_path / f"example{number}.py"
        script.write_text(code)
        env = {**os.environ, "PYTHONPATH": str(DOCS.parents[1])}
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        assert done.stdout == text


ADAPTERS = [DOCS / f"{name}.md" for name in ("openai-agents", "langchain", "pydantic-ai")]


@pytest.mark.parametrize("page", ADAPTERS, ids=[p.stem for p in ADAPTERS])
def test_adapters_hand_the_model_its_text(page: Path) -> None:
    """An adapter returns ``model_text()``: ``output`` alone hides cuts, exit signals and
    capped listings from the model (issue 22)."""
    code = blocks(page, "python")[0]  # the adapter's example (a page may have more)
    assert ".model_text()" in code
    assert not re.search(r"return .*\.output\b", code)
