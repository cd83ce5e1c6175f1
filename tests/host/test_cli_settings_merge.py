"""The CLI's flags and its settings file are one whole, validated once (issue 33, item 3); a
settings error is one line naming the key (or the flag), the value and what is accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam import ConfigurationError, Settings, Toolkit
from toolseam.policy.settings import parse_settings

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolseam", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=60, env={"PYTHONPATH": str(REPO),
                                                                "PATH": "/usr/bin:/bin"})


def test_a_file_with_egress_allow_and_the_network_flag_work_together(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text('egress_allow = ["pypi.org"]\n')
    done = _cli("call", "bash", '{"command": "echo ok"}', "--base-dir", str(tmp_path),
                "--config", str(config), "--network", "egress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # exited 2 before: the flag came after validation
    assert json.loads(done.stdout)["output"] == "ok\n"


def test_the_flags_name_themselves_in_errors(tmp_path: Path) -> None:
    done = _cli("call", "bash", '{"command": "true"}', "--egress-allow", "x.org", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--egress-allow" in done.stderr
    assert "--network egress" in done.stderr and "limits.network" not in done.stderr


def test_a_file_error_names_the_key_and_the_value(tmp_path: Path) -> None:
    config = tmp_path / "s.toml"
    config.write_text('read_scope = "cwd"\n')
    done = _cli("call", "bash", '{"command": "true"}', "--config", str(config), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "read_scope" in done.stderr and "'cwd'" in done.stderr
    assert "'working-dir'" in done.stderr  # what would be accepted


BAD = st.sampled_from([
    ("read_scope", st.text(min_size=1, max_size=20).filter(
        lambda v: v not in ("working-dir", "unrestricted"))),
    ("timeout_policy", st.integers()),
    ("max_jobs", st.integers(max_value=0)),
    ("output_limit_bytes", st.integers(max_value=1)),
    ("kill_grace_ms", st.integers(max_value=-1)),
    ("portable_names", st.lists(st.integers(), min_size=1)),
    ("output_style", st.text(max_size=10).filter(lambda v: v not in ("toolseam", "toolnexus"))),
])


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_settings_error_is_one_clean_line_naming_the_key(data: st.DataObject) -> None:
    key, values = data.draw(BAD)
    value = data.draw(values)
    for attempt in (lambda: parse_settings({key: value}),
                    lambda: Toolkit("host", settings={key: value}),
                    lambda: Settings(**{key: value})):
        with pytest.raises(ConfigurationError) as refused:
            attempt()
        text = str(refused.value)
        assert "\n" not in text and key in text
        assert "errors.pydantic.dev" not in text and "input_value" not in text
