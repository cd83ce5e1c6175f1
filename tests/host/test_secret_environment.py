"""The secret filter (docs/security.md): common secret names and credential-looking values never
reach a command unless allow-listed by name; ordinary variables always do."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam import Settings, Toolkit
from toolseam.policy.environment import command_environment, looks_secret

REPORTED = {  # issue 18 point 14: each of these reached commands
    "MYSQL_PWD": "hunter2",
    "SMTP_PASS": "hunter2",
    "DATABASE_URL": "postgres://app:hunter2@db.internal:5432/app",
    "NPM_CONFIG__AUTH": "dXNlcjpodW50ZXIy",
    "SENTRY_DSN": "https://abc123@o1.ingest.sentry.io/42",
    "MY_APIKEY": "abc123",
    "SSH_AUTH_SOCK": "/tmp/ssh-XXXX/agent.1234",
}
ORDINARY = {
    "PATH": "/usr/bin:/bin", "HOME": "/home/u", "PWD": "/work", "OLDPWD": "/", "LANG": "C.UTF-8",
    "TERM": "xterm", "USER": "u", "SHELL": "/bin/bash", "EDITOR": "vi", "LC_ALL": "C",
    "XDG_RUNTIME_DIR": "/run/user/1000", "VIRTUAL_ENV": "/work/.venv", "PYTHONPATH": "/work",
    "KEYBOARD_LAYOUT": "us", "PASSTHROUGH": "1", "GIT_AUTHOR_NAME": "A U Thor",
    "HTTP_PROXY": "http://proxy:3128", "REPO_URL": "https://github.com/o/r.git",
    "SSH_CONNECTION": "1 2 3 4", "MONKEY": "banana", "TASK_ID": "sk-12",
}
SECRET_WORDS = ["KEY", "APIKEY", "ACCESSKEY", "AUTH", "DSN", "COOKIE", "SALT", "JWT", "BEARER",
                "WEBHOOK", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIALS",
                "PRIVATE", "API_KEY"]
word = st.text(alphabet="ABCDEFGHIJLMNOQRUVXYZ0123456789", min_size=1, max_size=8)  # no K/P/S/T/W


def test_every_reported_name_is_dropped() -> None:
    assert command_environment({**REPORTED, **ORDINARY}) == ORDINARY


def test_allow_list_passes_a_secret_on_purpose() -> None:
    env = command_environment(REPORTED, allow=["DATABASE_URL", "SSH_AUTH_SOCK"])
    assert env == {name: REPORTED[name] for name in ("DATABASE_URL", "SSH_AUTH_SOCK")}


@given(before=st.lists(word, max_size=2), secret=st.sampled_from(SECRET_WORDS),
       after=st.lists(word, max_size=2), lower=st.booleans())
def test_a_secret_word_anywhere_in_a_name_drops_it(before: list[str], secret: str,
                                                   after: list[str], lower: bool) -> None:
    name = "_".join([*before, secret, *after])
    name = name.lower() if lower else name
    assert looks_secret(name)
    assert command_environment({name: "x"}) == {}
    assert command_environment({name: "x"}, allow=[name]) == {name: "x"}


@given(before=st.lists(word, min_size=1, max_size=2), secret=st.sampled_from(["PASS", "PWD"]))
def test_pass_and_pwd_after_another_word_drop_it(before: list[str], secret: str) -> None:
    assert looks_secret("_".join([*before, secret]))


@given(name=st.sampled_from(sorted(ORDINARY)) | word,
       scheme=st.sampled_from(["postgres", "mysql", "redis", "amqp", "https", "mongodb+srv"]),
       user=st.text(alphabet="abcxyz019._-", max_size=8),
       password=st.text(alphabet="abcXYZ019!$%^&*()~", min_size=1, max_size=12),
       host=st.sampled_from(["db", "10.0.0.1", "db.example:5432"]), path=st.sampled_from(["", "/x"]))
def test_a_url_with_a_password_drops_any_name(name: str, scheme: str, user: str, password: str,
                                              host: str, path: str) -> None:
    value = f"{scheme}://{user}:{password}@{host}{path}"
    assert command_environment({name: value}) == {}
    assert command_environment({name: value}, allow=[name]) == {name: value}


@given(name=word, value=st.sampled_from([
    "host=db user=app password=hunter2", "Driver={x};Server=db;Uid=app;Pwd=hunter2;",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nabc", "ghp_" + "a1" * 18, "github_pat_" + "A" * 30,
    "xoxb-1234567890-abcdef", "AKIA" + "ABCDEFGHIJKLMNOP", "sk-" + "x" * 40, "glpat-" + "y" * 20,
    "npm_" + "a" * 36, "AIza" + "b" * 35]))
def test_credential_values_drop_any_name(name: str, value: str) -> None:
    assert command_environment({name: value}) == {}


@given(names=st.dictionaries(st.sampled_from(sorted(ORDINARY)), st.just(""), max_size=len(ORDINARY)))
def test_ordinary_variables_pass_unchanged(names: dict[str, str]) -> None:
    source = {name: ORDINARY[name] for name in names}
    assert command_environment(source) == source


@given(source=st.dictionaries(st.text(min_size=1, max_size=12), st.text(max_size=40)),
       allow=st.lists(st.text(min_size=1, max_size=12), max_size=3))
def test_the_filter_only_ever_removes(source: dict[str, str], allow: list[str]) -> None:
    env = command_environment(source, allow)
    assert all(source[name] == value for name, value in env.items())
    assert all(name in env for name in allow if name in source and not name.startswith("TOOLSEAM_"))


async def test_a_command_sees_none_of_the_reported_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in REPORTED.items():
        monkeypatch.setenv(name, value)
    async with Toolkit("host", base_dir=str(tmp_path),
                       settings=Settings(env_allow=["SMTP_PASS"])) as tk:
        result = await tk.call("bash", {"command": "env"})
    seen = dict(line.split("=", 1) for line in result.output.splitlines() if "=" in line)
    assert seen.get("SMTP_PASS") == "hunter2"
    assert not (set(REPORTED) - {"SMTP_PASS"}) & set(seen)
    assert "hunter2@" not in result.output
