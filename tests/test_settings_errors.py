"""Settings errors: one line naming the key, the value and the fix, never pydantic's own noise;
the CLI lays its flags over the settings file before validating (issue 33, item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from toolseam import Settings, Toolkit, parse_settings
from toolseam.seam.errors import ConfigurationError

NOISE = ("errors.pydantic.dev", "input_value", "input_type", "validation error for")

_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                   max_size=3),
    max_leaves=6)


def _assert_one_line(message: str, key: str) -> None:
    assert "\n" not in message
    assert key in message
    for noise in NOISE:
        assert noise not in message


@settings(max_examples=300, suppress_health_check=[HealthCheck.filter_too_much])
@given(key=st.sampled_from(sorted(Settings.model_fields)), value=_values)
def test_an_invalid_setting_is_one_line_naming_its_key(key: str, value: Any) -> None:
    for make in (lambda: Settings(**{key: value}), lambda: parse_settings({key: value}, "f.toml"),
                 lambda: Toolkit("host", settings={key: value})):
        try:
            make()
        except ConfigurationError as exc:
            _assert_one_line(str(exc), key)
        else:
            assume(False)  # a valid value: nothing to say


@given(key=st.text(min_size=1, max_size=12).filter(lambda k: k not in Settings.model_fields),
       value=_values)
def test_an_unknown_key_is_named_with_its_fix(key: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings(**{key: value})
    message = str(caught.value)
    assert "\n" not in message and repr(key) in message and "remove it" in message
    for noise in NOISE:
        assert noise not in message


def test_the_value_and_the_fix_are_in_the_message() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings(max_jobs="three")
    assert str(caught.value) == ("settings: max_jobs = 'three': should be a valid integer; set "
                                 "max_jobs to such a value or remove it for the default")
    assert isinstance(Settings.model_validate({"max_jobs": 4}), Settings)


def _cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "toolseam", *argv], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=os.environ.copy())


def test_cli_flags_complete_the_settings_file(tmp_path: Path) -> None:
    """The file's egress_allow with --network egress: one whole, valid before the flag too."""
    config = tmp_path / "s.toml"
    config.write_text('egress_allow = ["example.invalid"]\n')
    done = _cli("call", "--config", str(config), "--network", "egress", "bash",
                json.dumps({"command": "echo merged"}), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "merged\n"
    # and a flag the file contradicts is named with its key, on one line
    config.write_text('[limits]\nnetwork = "none"\n')
    done = _cli("call", "--config", str(config), "--egress-allow", "example.invalid", "bash",
                json.dumps({"command": "true"}), cwd=tmp_path)
    assert done.returncode == 2
    line, = done.stderr.splitlines()
    assert "egress_allow" in line and "--network egress" in line and "--egress-allow" in line


@pytest.mark.parametrize(("toml", "key"), [
    ("max_jobs = \"x\"\n", "max_jobs"), ("[limits]\nmemory = 5\n", "limits.memory"),
    ("bogus = 1\n", "bogus"), ("egress_allow = [5]\n[limits]\nnetwork = \"egress\"\n",
                               "egress_allow")])
def test_cli_settings_error_is_one_line(tmp_path: Path, toml: str, key: str) -> None:
    config = tmp_path / "s.toml"
    config.write_text(toml)
    done = _cli("call", "--config", str(config), "bash", json.dumps({"command": "true"}),
                cwd=tmp_path)
    assert done.returncode == 2
    line, = done.stderr.splitlines()
    _assert_one_line(line, key)
    assert str(config) in line
