"""Rootless podman run by root for another user (issue 33, item 7): a bind-mode workspace that
user cannot write, or cannot reach, is refused at open with one line naming the directory, the
user and the fix — it used to open silently (every step then failed ``Permission denied``) or
fail with the engine's own ``statfs … permission denied``.

The engine's user is ``TOOLSEAM_ROOTLESS_USER`` (``tests/engines.py``); the directories are
root's, made here, below the shared test directory that user may enter.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam import ConfigurationError, SandboxPool, Toolkit
from toolseam.backends.containers.modes.workspace_access import check_workspace_access

from ..support.contract_bindings import pool_factory
from ..support.engines import backend, endpoint, remove_shared, required_env, shared_dir

ENGINE = "podman-rootless"


@pytest.fixture
def user() -> str:
    endpoint(ENGINE)
    return required_env("TOOLSEAM_ROOTLESS_USER", ENGINE)


@pytest.fixture
def place() -> Iterator[Path]:
    where = shared_dir()  # 0777 below a 1777 directory: the user may enter it
    yield where
    remove_shared(where)


def made(path: Path, mode: int) -> Path:
    path.mkdir()
    path.chmod(mode)
    return path


async def refusal(workspace: Path, **options: object) -> tuple[str, object]:
    """The error opening a rootless sandbox on ``workspace`` raises, and its backend."""
    opened = backend(ENGINE, str(workspace), **options)
    with pytest.raises(ConfigurationError) as caught:
        async with Toolkit(opened):
            pass
    return str(caught.value), opened


def _no_container(opened: object) -> None:
    sandbox = opened.sandbox  # type: ignore[attr-defined]
    assert sandbox.container is None  # refused before the engine made anything
    names = [name for name, _ in sandbox.engine.labeled("toolseam.session")
             if name == f"toolseam-{sandbox.session_id}"]
    assert names == []


@pytest.mark.asyncio
async def test_a_workspace_the_user_cannot_write_is_refused_naming_it(user: str, place: Path
                                                                      ) -> None:
    workspace = made(place / "roots", 0o755)
    message, opened = await refusal(workspace)
    assert "\n" not in message
    assert message.startswith(f"the workspace {workspace} (mode 0755, owner root:root) is not "
                              f"writable by {user} (uid {pwd.getpwnam(user).pw_uid})"), message
    assert f"chown -R {user} {workspace}" in message and "workspace_mode='copy'" in message
    _no_container(opened)


@pytest.mark.asyncio
async def test_a_workspace_the_user_cannot_reach_names_the_directory_in_the_way(
        user: str, place: Path) -> None:
    locked = made(place / "locked", 0o700)
    workspace = made(locked / "ws", 0o777)  # open itself: only the way to it is shut
    message, opened = await refusal(workspace)
    assert "\n" not in message and f"out of reach of {user}" in message, message
    assert f"may not enter {locked} (mode 0700, owner root:root)" in message, message
    assert f"chmod o+x {locked}" in message and "workspace_mode='copy'" in message
    _no_container(opened)
    # a link to it, in a directory the user may enter, does not get round the check
    link = place / "link"
    link.symlink_to(workspace)
    message, _ = await refusal(link)
    assert f"may not enter {locked} " in message, message


@pytest.mark.asyncio
async def test_the_fixes_the_refusal_names_work(user: str, place: Path) -> None:
    locked = made(place / "locked", 0o700)
    workspace = made(locked / "ws", 0o755)
    async with Toolkit(backend(ENGINE, str(workspace), workspace_mode="copy")) as tk:
        wrote = await tk.call("bash", {"command": "echo copied > out.txt"})
        assert not wrote.is_error, wrote.output
    assert (workspace / "out.txt").read_text() == "copied\n"  # brought home by root
    uid = pwd.getpwnam(user).pw_uid
    os.chown(locked, uid, -1)
    os.chown(workspace, uid, -1)
    async with Toolkit(backend(ENGINE, str(workspace))) as tk:  # bind mode, as the user
        wrote = await tk.call("bash", {"command": "echo bound > bound.txt"})
        assert not wrote.is_error, wrote.output
    assert (workspace / "bound.txt").stat().st_uid == uid


@pytest.mark.asyncio
async def test_a_pool_hand_out_refuses_the_same_workspace(user: str, place: Path) -> None:
    workspace = made(place / "roots", 0o755)
    async with SandboxPool(pool_factory(ENGINE), size=1) as pool:
        assert pool.mode == "bind"  # rootless podman's own mount namespace (decision 114)
        with pytest.raises(ConfigurationError, match=f"is not writable by {user} "):
            await pool.toolkit(workspace)
        fine = made(place / "fine", 0o777)
        tk = await pool.toolkit(fine)  # the pool goes on handing out
        assert not (await tk.call("bash", {"command": "touch here"})).is_error
        await tk.close()


def _user_can(user: str, workspace: Path) -> bool:
    """What the user can really do: enter the workspace, list it and make a file in it."""
    done = subprocess.run(["runuser", "-u", user, "--", "sh", "-c",
                           'cd "$1" && ls . >/dev/null && touch "$1/f"',
                           "sh", str(workspace)], capture_output=True, timeout=30)
    return done.returncode == 0


MODES = st.sampled_from([0o700, 0o711, 0o750, 0o755, 0o770, 0o777, 0o555, 0o733])


@pytest.mark.skipif(os.geteuid() != 0, reason="asks as another user: needs root")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parent_mode=MODES, mode=MODES, users_own=st.booleans(), group_users=st.booleans())
def test_the_verdict_is_what_the_user_can_do(user: str, place: Path, parent_mode: int,
                                             mode: int, users_own: bool, group_users: bool
                                             ) -> None:
    """Refused exactly when the user cannot enter, list and write in the workspace, whatever the
    modes and owners on the way (the kernel's word, through a child with the user's ids)."""
    entry = pwd.getpwnam(user)
    parent = place / os.urandom(4).hex()
    workspace = parent / "ws"
    workspace.mkdir(parents=True)
    os.chown(workspace, entry.pw_uid if users_own else 0, entry.pw_gid if group_users else 0)
    workspace.chmod(mode)
    parent.chmod(parent_mode)
    try:
        check_workspace_access(str(workspace), entry.pw_uid, ENGINE)
        refused = False
    except ConfigurationError:
        refused = True
    able = _user_can(user, workspace)
    assert refused == (not able), (oct(parent_mode), oct(mode), users_own, group_users)
