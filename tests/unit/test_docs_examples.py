"""Every fenced ``toml``/``json`` block in README.md and docs/ parses; every one that is a
settings example (it names a ``Settings`` field) loads through ``load_settings`` exactly as a
user would save it — a settings example the code rejects is a bug in the docs or the code.
And no install line points at a package index toolseam is not on."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from toolseam import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(toml|json)[ \t]*\n(.*?)^```", re.M | re.S)


def blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match[1], match[2]))
    return found


BLOCKS = blocks()


def parse(language: str, text: str) -> Any:
    return tomllib.loads(text) if language == "toml" else json.loads(text)


def test_the_docs_have_settings_examples_in_both_formats() -> None:
    languages = {language for _, language, text in BLOCKS
                 if isinstance(parsed := parse(language, text), dict)
                 and set(parsed) & set(Settings.model_fields)}
    assert languages == {"toml", "json"}


@pytest.mark.parametrize(("where", "language", "text"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_every_fenced_example_parses_and_settings_load(where: str, language: str, text: str,
                                                       tmp_path: Path) -> None:
    parsed = parse(language, text)
    if isinstance(parsed, dict) and set(parsed) & set(Settings.model_fields):
        saved = tmp_path / f"toolseam.{language}"
        saved.write_text(text)
        settings = load_settings(saved)  # raises ConfigurationError naming the field
        given = {key: tuple(value) if isinstance(value, list) and key == "timeout_range_ms"
                 else value for key, value in parsed.items() if key != "schema_version"}
        assert _given_part(settings.model_dump(), given) == given


def _given_part(dumped: Any, given: Any) -> Any:
    """Of ``dumped``, the keys ``given`` names, nested tables included (a ``[limits]`` table
    that sets the network alone leaves the other limits at their defaults)."""
    if isinstance(given, dict) and isinstance(dumped, dict):
        return {key: _given_part(dumped.get(key), value) for key, value in given.items()}
    return dumped


def test_the_long_running_commands_example_as_it_was_is_refused(tmp_path: Path) -> None:
    """The example docs/long-running-commands.md showed before: a range below the detach
    default. The check above is what catches such an example."""
    from toolseam import ConfigurationError

    old = tmp_path / "old.toml"
    old.write_text('timeout_policy = "detach"\ndefault_timeout_ms = 600000\n'
                   'timeout_range_ms = [1000, 300000]\n')
    with pytest.raises(ConfigurationError, match="outside timeout_range_ms"):
        load_settings(old)


# A bare `pip install toolseam` (or `'toolseam[...]'`) fails: the package is on no public index.
BARE_INSTALL = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?toolseam(?:\[|['\"\s]|$)", re.M)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_no_install_line_assumes_a_public_index(page: Path) -> None:
    bad = [line for line in page.read_text().splitlines() if BARE_INSTALL.search(line)]
    assert bad == [], f"{page.relative_to(ROOT)}: {bad}"


# --- the README, in the order a newcomer reads it ------------------------------------------
README = (ROOT / "README.md").read_text()


def test_readme_says_what_it_is_then_install_commands_use_and_only_then_the_test_rig() -> None:
    headings = re.findall(r"^## (.+)$", README, re.M)
    order = ["Install", "The two commands (fresh Debian machine, as root)", "Use it",
             "The test suite"]
    assert [h for h in headings if h in order] == order
    assert README.index("`.ci/run` calls `scripts/test`") > README.index("## The test suite")
    first = README.split("\n## ", 1)[0]
    assert "one seam" in first and "bash" in first  # what toolseam is, before anything else
    assert "scripts/demo   # the main job" in README and "scripts/test   # the whole suite" in README


def test_readme_names_every_extra_and_what_it_brings() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = config["project"]["optional-dependencies"]
    install = README.split("## Install", 1)[1].split("\n## ", 1)[0]
    for extra, requirements in extras.items():
        (row,) = [line for line in install.splitlines() if line.startswith(f"| `{extra}` |")]
        for requirement in requirements:
            name = re.split(r"[<>=\[;]", requirement)[0]
            if name != "toolseam" and not name.startswith("types-"):
                assert f"`{name}`" in row, (extra, name)
    assert "pip install -e '/path/to/checkout[mcp,integrations]'" in install
    assert "pip wheel --no-deps -w dist ." in install and "python -m build" in install


def test_readme_is_honest_about_the_host_backend() -> None:
    host = README.split("## What the host backend contains", 1)[1].split("\n## ", 1)[0]
    assert "bash is not confined" in host and "as the user running toolseam" in host
    assert "pid namespace" in host and "container backend" in host


PYTHON = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


@pytest.mark.parametrize("code", [c for c in PYTHON if "Backend(" not in c],
                         ids=lambda code: code.splitlines()[1][:40])
def test_readme_host_examples_run_as_written(code: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    (tmp_path / "README.md").write_text("hello from the README example\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "README.md" in done.stdout or "hello from the README example" in done.stdout
