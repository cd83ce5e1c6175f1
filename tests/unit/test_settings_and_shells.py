"""Validated settings (round trip, upgrade, every rejection) and the shell catalog."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolseam import ConfigurationError, Settings, Toolkit, load_settings, parse_settings
from toolseam.policy.shells import ShellChoice, ShellResolver, check_pin
from toolseam.seam.errors import ShellChangedError, ShellNotFound, UnknownShellError
from toolseam.testing.fake import FakeBackend


def test_round_trip_through_toml_and_json(tmp_path: Path) -> None:
    settings = Settings(timeout_policy="detach", default_timeout_ms=120_000, max_jobs=5,
                        timeout_range_ms=(1000, 300_000), shell_id="bash",
                        read_scope="working-dir", env_allow=["CI_TOKEN"])
    as_json = tmp_path / "s.json"
    as_json.write_text(settings.model_dump_json())
    assert load_settings(as_json) == settings
    as_toml = tmp_path / "s.toml"
    as_toml.write_text('schema_version = 2\ntimeout_policy = "detach"\ndefault_timeout_ms = 120000\n'
                       'max_jobs = 5\ntimeout_range_ms = [1000, 300000]\nshell_id = "bash"\n'
                       'read_scope = "working-dir"\nenv_allow = ["CI_TOKEN"]\n')
    assert load_settings(as_toml) == settings


def test_version_one_upgrades_additively() -> None:
    old = parse_settings({"schema_version": 1, "read_max_bytes": 1000})
    assert old.schema_version == 2 and old.read_max_bytes == 1000
    assert (old.timeout_policy, old.max_jobs, old.job_max_ms) == ("kill", 3, 3_600_000)
    assert old.effective_default_timeout_ms == 60_000


@pytest.mark.parametrize(("data", "message"), [
    ({"default_timeout_ms": -1}, "default_timeout_ms: Input should be greater than or equal to 0"),
    ({"job_max_ms": 0}, "job_max_ms: Input should be greater than 0"),
    ({"max_jobs": 0}, "max_jobs: Input should be greater than 0"),
    ({"bogus": 1}, "unknown field 'bogus'"),
    ({"timeout_policy": "nap"}, "timeout_policy: Input should be 'kill' or 'detach'"),
    ({"default_timeout_ms": 0}, "default_timeout_ms 0 (unbounded) needs timeout_policy 'detach'"),
    ({"timeout_range_ms": [1000, 30_000]}, "default timeout 60000 ms is outside timeout_range_ms"),
    ({"schema_version": 9}, "schema_version 9 is not one of 1, 2"),
    ({"shell": ["bash", "-c"], "shell_id": "bash"}, "set shell (an argv prefix) or shell_id, not both"),
    # no coercion: a string is not a number, a boolean is not a count
    ({"job_max_ms": "3600000"}, "job_max_ms: Input should be a valid integer"),
    ({"max_jobs": True}, "max_jobs: Input should be a valid integer"),
    ({"default_timeout_ms": "1000"}, "default_timeout_ms: Input should be a valid integer"),
    ({"portable_names": "yes"}, "portable_names: Input should be a valid boolean"),
    ({"job_max_ms": 2**31}, "job_max_ms: Input should be less than or equal to 2147483647"),
])
def test_invalid_values_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_settings(data)
    assert message in str(caught.value)


def test_toml_strings_are_not_coerced(tmp_path: Path) -> None:
    file = tmp_path / "s.toml"
    file.write_text('default_timeout_ms = "1000"\ntimeout_range_ms = [1000, 300000]\n')
    with pytest.raises(ConfigurationError, match="default_timeout_ms: Input should be a valid integer"):
        load_settings(file)
    file.write_text('timeout_range_ms = [1000, 300000]\n')
    assert load_settings(file).timeout_range_ms == (1000, 300_000)


async def test_pinned_shell_that_stops_resolving_is_a_shell_change() -> None:
    """A pin whose shell vanished mid-turn (no fallback left): COMMAND_SHELL_CHANGED, nothing runs."""
    backend = FakeBackend()
    backend.files["/bin/bash"] = b"#!fake"
    backend.modes["/bin/bash"] = 0o755
    async with Toolkit(backend, settings=Settings(shell_id="bash")) as tk:
        await tk.pin_shell()
        del backend.files["/bin/bash"]  # not persisted: an unavailable id does not fall back
        with pytest.raises(ShellChangedError) as caught:
            await tk.call("bash", {"command": "echo ran"})
    assert caught.value.code == "COMMAND_SHELL_CHANGED"
    assert "no longer resolves" in str(caught.value)


def test_unreadable_or_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read settings file"):
        load_settings(tmp_path / "missing.toml")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigurationError, match="not valid json"):
        load_settings(bad)
    (tmp_path / "list.json").write_text(json.dumps([1]))
    with pytest.raises(ConfigurationError, match="top level must be a table"):
        load_settings(tmp_path / "list.json")


def _exists(*present: str):  # type: ignore[no-untyped-def]
    async def exists(path: str) -> bool:
        return path in present
    return exists


async def test_posix_detection_and_catalog() -> None:
    resolver = ShellResolver("posix", _exists("/bin/sh", "/usr/bin/bash"), {"PATH": "/usr/bin"})
    assert (await resolver.resolve()).argv == ("/bin/sh", "-c")
    assert await resolver.available() == ["bash", "sh"]
    chosen = await resolver.resolve(shell_id="bash")
    assert (chosen.argv, chosen.id, chosen.fallback) == (("/usr/bin/bash", "-c"), "bash", False)
    verbatim = await resolver.resolve(shell=["zsh", "-fc"])
    assert verbatim.argv == ("zsh", "-fc") and verbatim.label == "zsh -fc"


@pytest.mark.parametrize(("shell_id", "message"), [
    ("fish", "unknown shell id 'fish'"),
    ("cmd", "shell id 'cmd' is a windows shell; this sandbox is posix"),
    ("bash", "shell 'bash' is not available here"),
])
async def test_catalog_rejections(shell_id: str, message: str) -> None:
    resolver = ShellResolver("posix", _exists("/bin/sh"), {})
    with pytest.raises(UnknownShellError, match=message):
        await resolver.resolve(shell_id=shell_id)


async def test_persisted_unavailable_id_falls_back() -> None:
    resolver = ShellResolver("posix", _exists("/bin/sh"), {})
    chosen = await resolver.resolve(shell_id="bash", persisted=True)
    assert (chosen.id, chosen.fallback, chosen.argv) == ("sh", True, ("/bin/sh", "-c"))
    with pytest.raises(ShellNotFound):
        await ShellResolver("posix", _exists(), {}).resolve(shell_id="bash", persisted=True)
    with pytest.raises(ShellNotFound, match=r"tried: /bin/sh, /usr/bin/sh"):
        await ShellResolver("posix", _exists(), {}).resolve()


async def test_windows_catalog_and_detection_order() -> None:
    env = {"COMSPEC": r"C:\Windows\system32\cmd.exe", "PATH": r"C:\tools;C:\Windows",
           "SystemRoot": r"C:\Windows", "ProgramFiles": r"C:\Program Files"}
    everything = ShellResolver("windows", _exists(
        r"C:\Windows\system32\cmd.exe", r"C:\tools\pwsh.exe",
        r"C:\Windows\System32\WindowsPowerShell\v1.0\powershell.exe",
        r"C:\Program Files\Git\bin\bash.exe"), env)
    assert (await everything.resolve()).argv == (r"C:\Windows\system32\cmd.exe", "/d", "/s", "/c")
    assert await everything.available() == ["cmd", "windows-powershell", "git-bash"]
    git_bash = await everything.resolve(shell_id="git-bash")
    assert git_bash.argv == (r"C:\Program Files\Git\bin\bash.exe", "-lc")
    no_cmd = ShellResolver("windows", _exists(r"C:\tools\pwsh.exe"), {**env, "COMSPEC": "X:\\none"})
    assert (await no_cmd.resolve()).argv == (r"C:\tools\pwsh.exe", "-NoProfile", "-Command")
    with pytest.raises(UnknownShellError, match="is a posix shell"):
        await everything.resolve(shell_id="sh")


def test_pin_check() -> None:
    pinned = ShellChoice(("/bin/sh", "-c"), None)
    check_pin(pinned, ShellChoice(("/bin/sh", "-c"), None))
    with pytest.raises(ShellChangedError) as caught:
        check_pin(pinned, ShellChoice(("/bin/bash", "-c"), "bash"))
    assert caught.value.code == "COMMAND_SHELL_CHANGED"


async def test_shell_changed_between_pin_and_spawn_fails_the_call() -> None:
    backend = FakeBackend()
    backend.files["/bin/bash"] = b"#!fake"
    backend.modes["/bin/bash"] = 0o755
    async with Toolkit(backend, settings=Settings(shell_id="bash"), shell_id_persisted=True) as tk:
        assert (await tk.pin_shell()).argv == ("/bin/bash", "-c")
        ok = await tk.call("bash", {"command": "echo ok"})
        assert (ok.metadata["shell"], ok.metadata["shellId"]) == ("/bin/bash -c", "bash")
        del backend.files["/bin/bash"]  # bash disappears mid-turn: resolution falls back to sh
        with pytest.raises(ShellChangedError):
            await tk.call("bash", {"command": "echo ok"})
        await tk.end_turn()
        assert (await tk.pin_shell()).fallback  # the next turn pins the fallback, and says so
        result = await tk.call("bash", {"command": "echo ok"})
        assert (result.metadata["shell"], result.metadata["shellFallback"]) == ("/bin/sh -c", True)


async def test_no_shell_fails_at_construction_only_when_bash_is_enabled() -> None:
    backend = FakeBackend()
    del backend.files["/bin/sh"]
    with pytest.raises(ShellNotFound):
        await Toolkit(backend).open()
    async with Toolkit(FakeBackend(), tools={"bash": False}) as tk:
        assert "bash" not in tk.tool_names
    backend = FakeBackend()
    del backend.files["/bin/sh"]
    async with Toolkit(backend, tools={"bash": False}) as tk:
        assert (await tk.call("write", {"path": "x", "content": "y"})).output == "Wrote 1 bytes to x"


async def test_timeout_range_rejects_out_of_range_calls() -> None:
    async with Toolkit(FakeBackend(), settings=Settings(timeout_range_ms=(1000, 300_000))) as tk:
        result = await tk.call("bash", {"command": "true", "timeout": 500})
        assert result.output == "bash: timeout 500ms is outside the accepted range 1000-300000ms"
