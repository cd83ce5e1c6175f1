"""Bindings of the contract suite to branched container sessions (issue 48; decisions 463-465):
a class's cases run in ONE session of the class — a child made by a real ``fork(1)``, or a
session restored from a snapshot — and every case starts from that session's start state: the
first case as the branch was made, each later one restored to it after hostile changes.

A case opens no sandbox of its own (a container per case, and a fork per case, would cost the
suite minutes: decision 463), so what it meets is what a restore left of the previous case and
of the hostile changes below — the property under test, asserted before each case: the
workspace and the writable layer read back exactly as at the start (``STATE``). Which contract cases run
is each binding's ``kept_cases`` (decision 464): the others are left out by name, and a name
that is no case of the binding is an error at import, so the list cannot go stale.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import pytest_asyncio

from toolseam import Snapshot, Toolkit
from toolseam.testing.contract import Sandbox

from .engines import backend, remove_shared, shared_dir

# What the session holds outside /workspace at its start: the writable layer's /tmp (a tmpfs
# under the default hardening), which a restore and a fork's child must put back too.
START_LAYER = "mkdir -p /tmp/branch/kept && echo start > /tmp/branch/from-start"
# Dirs, files, links (one to /), a 500 dir and a 000 file in the workspace; and the layer's
# file rewritten, a dir and a link to /etc added and its dir made 500.
WORKSPACE_CHANGES = ("mkdir -p junk/deep && echo x > junk/deep/f && echo y > top && "
                     "ln -s top link && ln -s / root-link && chmod 500 junk && chmod 000 top")
LAYER_CHANGES = ("mkdir -p /tmp/branch/made && echo changed > /tmp/branch/from-start && "
                 "ln -s /etc /tmp/branch/etc-link && chmod 500 /tmp/branch")
EMPTY_WORKSPACE = ("find /workspace -mindepth 1 -type d -exec chmod u+rwx -- {} + && "
                   "find /workspace -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +")
# Every name of the workspace and of the layer's dir with its kind, mode, owner and (not for
# a directory, whose size on ext4 keeps what it once held) size and link target.
STATE = ("find /workspace /tmp/branch \\( -type d -printf '%p d %m %U:%G\\n' \\) "
         "-o -printf '%p %y %m %U:%G %s %l\\n' | sort && cat /tmp/branch/from-start")


def below_workspace(state: str) -> list[str]:
    return [line for line in state.splitlines() if not line.startswith("/workspace d ")]


async def run_or_fail(tk: Toolkit, command: str) -> str:
    result = await tk.call("bash", {"command": command})
    assert not result.is_error, (command, result.output)
    return result.output


@dataclass
class Branch:
    session: Toolkit
    start: Snapshot  # what every case starts from
    host_dir: Path
    state: str  # STATE at the start
    used: bool = False


class SharedBranchBinding:
    """One branched session per class (``open_branch``), each case restored to its start."""

    engine = ""
    kept_cases: ClassVar[frozenset[str]] = frozenset()
    first_case_as_made = False  # the first case meets the session as made, not restored
    pytestmark = [pytest.mark.asyncio(loop_scope="class")]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.kept_cases:
            return  # a base of the bindings
        cases = {name for name in dir(cls) if name.startswith("test_")}
        assert cls.kept_cases <= cases, f"{cls.__name__}: no such case {cls.kept_cases - cases}"
        for name in cases - cls.kept_cases:
            setattr(cls, name, None)  # left out (decision 464)

    @classmethod
    def made(cls, host_dir: Path) -> Any:
        """The backend a branch starts from: the binding's engine (a Ray binding's node)."""
        return backend(cls.engine, str(host_dir))

    @classmethod
    async def open_branch(cls, host_dir: Path, opened: list[Toolkit]) -> tuple[Toolkit, Snapshot]:
        """The branched session (its toolkits appended to ``opened``, closed at the end) and
        the snapshot every case starts from."""
        raise NotImplementedError

    @pytest_asyncio.fixture(scope="class", loop_scope="class")
    @classmethod
    async def branch(cls, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Branch]:
        host_dir = shared_dir()
        opened: list[Toolkit] = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TOOLSEAM_SNAPSHOTS", str(tmp_path_factory.mktemp("snapshots")))
            try:
                session, start = await cls.open_branch(host_dir, opened)
                yield Branch(session, start, host_dir, await run_or_fail(session, STATE))
            finally:
                for tk in reversed(opened):
                    await tk.close()
                remove_shared(host_dir)

    @pytest_asyncio.fixture(loop_scope="class")
    async def sandbox(self, branch: Branch) -> Sandbox:
        if branch.used or not self.first_case_as_made:
            await run_or_fail(branch.session, f"{WORKSPACE_CHANGES} && {LAYER_CHANGES}")
            await branch.session.restore(branch.start)
            now = await run_or_fail(branch.session, STATE)
            assert now == branch.state, (now, branch.state)
        branch.used = True
        return Sandbox(branch.session.backend, branch.session.base_dir, branch.host_dir)


class RestoredSession(SharedBranchBinding):
    """A session of the binding's engine (its mode: bind on this machine's engines, copy on
    the remote ones), snapshotted at its start and restored to it before every case."""

    @classmethod
    async def open_branch(cls, host_dir: Path, opened: list[Toolkit]) -> tuple[Toolkit, Snapshot]:
        tk = Toolkit(cls.made(host_dir))
        opened.append(tk)
        await run_or_fail(tk, START_LAYER)
        return tk, await tk.snapshot("start")


class ForkedChild(SharedBranchBinding):
    """The child of a real ``fork(1)`` (a copy-mode sandbox, decision 401) of a parent that had
    files in its workspace and its layer and then emptied its workspace, as the suite wants;
    the parent is closed before the first case. The first case meets the child as forked;
    each later one, the child restored to the fork's snapshot."""

    first_case_as_made = True

    @classmethod
    async def open_branch(cls, host_dir: Path, opened: list[Toolkit]) -> tuple[Toolkit, Snapshot]:
        parent = Toolkit(cls.made(host_dir))
        opened.append(parent)
        await run_or_fail(parent, f"{START_LAYER} && {WORKSPACE_CHANGES}")
        await run_or_fail(parent, EMPTY_WORKSPACE)
        at_fork = await run_or_fail(parent, STATE)
        (child,) = await parent.fork(1)
        assert isinstance(child, Toolkit), child
        opened.append(child)
        # the parent's files as they were; not /workspace's own mode, which no snapshot holds:
        # the child is a copy-mode sandbox, whose /workspace is 755 like every fresh one's,
        # whatever the mode of its parent's host dir (decision 465)
        as_forked = below_workspace(await run_or_fail(child, STATE))
        assert as_forked == below_workspace(at_fork), (as_forked, at_fork)
        await parent.close()
        (start,) = [snap for snap in Snapshot.all() if snap.label == f"fork of {parent.session_id}"]
        return child, start
