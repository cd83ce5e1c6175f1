"""The contract suite on a branch (issue 48): a session forked from another, working in its own
private workspace, and a session restored from a snapshot after its files were changed — each
must be indistinguishable from a fresh session of its backend. On the host backend and on every
engine: podman rootful and rootless, docker (bind mode), the two remote engines (copy mode).

The host classes open a branch per case. The engine classes (``support/branch_bindings.py``,
decisions 463-465) run a class's cases in ONE branched session — a real ``fork(1)``'s child
(a copy-mode sandbox whatever its parent's mode, decision 401) of a parent that had files in
its workspace and ``/tmp`` and then emptied its workspace, or a session restored to its start
snapshot — restored to its start before each case (the fork's first case excepted) after
hostile changes in the workspace and in ``/tmp``, and checked to read back exactly as at the
start (names, kinds, modes, owners, sizes, link targets, contents) before the case runs.

Left out on the engines (decision 464), to keep the suite's time (these ten classes cost 81 s
serially, measured): every case of code a branch does not reach, which test_contract_host.py
and test_contract_containers.py run on fresh sessions of the same backends — how the read tool
cuts, pages and refuses text and knows images (the 84-case slicing tables, the page bounds,
``ReadToolContract``, whose ``toolkit`` fixture would also run outside the class's event
loop), a BOM, 3 MiB transfers, walk orders under a hostile backend, output order and
streaming, deadlines and floods, escapees after a timeout (2.7 s each: the grace period),
cancelled calls, catastrophic regexes, the detach policy's waits, evictions and ceiling; and
the cases that close their toolkit (they would close the class's one session). What each
engine class runs is ``BIND_MODE_CASES`` or ``COPY_MODE_CASES`` below."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from toolseam import Toolkit
from toolseam.seam.protocol import BuiltinExec
from toolseam.testing.contract import (
    ExecContract,
    FileContract,
    HostDirContract,
    JobContract,
    ListingContract,
    ProcessTreeContract,
    Sandbox,
)

from ..support.branch_bindings import ForkedChild, RestoredSession
from ..support.contract_bindings import ContainerBinding, CopyModeBinding
from ..support.processes import host_survivors


class _Branch:
    """Holds the toolkits a binding made, closed after each test (the suite closes only the
    backend it was given)."""

    toolkits: list[Toolkit]

    @pytest_asyncio.fixture(autouse=True)
    async def _own_store(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                         ) -> AsyncIterator[None]:
        monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(tmp_path / "store"))
        self.toolkits = []
        yield
        for tk in reversed(self.toolkits):
            await tk.close()

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)

    # The two 84-case slicing tables test how the read tool cuts text, the same code on a branch
    # as on its parent (test_contract_host.py runs them): left out here to keep the suite's time.
    test_read_window_is_a_slice_of_split_lines = None
    test_read_page_is_a_slice_of_lines = None


class TestHostForkedChild(_Branch, FileContract, ListingContract, ExecContract,
                          ProcessTreeContract):
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        parent = Toolkit("host", base_dir=host_dir)  # empty, as the suite wants the child
        self.toolkits.append(parent)
        (child,) = await parent.fork(1)
        assert isinstance(child, Toolkit)
        self.toolkits.append(child)
        return child.backend, child.base_dir


class TestHostRestoredSession(_Branch, FileContract, ListingContract, HostDirContract,
                              JobContract):
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        tk = Toolkit("host", base_dir=host_dir)
        self.toolkits.append(tk)
        empty = await tk.snapshot("empty")
        (host_dir / "junk" / "deep").mkdir(parents=True)
        (host_dir / "junk" / "deep" / "f").write_text("x\n")
        (host_dir / "top").write_text("y\n")
        (host_dir / "link").symlink_to("top")
        await tk.restore(empty)
        return tk.backend, str(host_dir)


# --- the engines: one branched session per class (support/branch_bindings.py) ---------------
# What a branch can change: the files (written, listed, searched, refused, committed), the
# workspace's own modes and owner, and the sandbox a fork's child is (its environment, its
# agent, its process tree and job table). Cases of code a branch does not reach are left out
# (decision 464; the module's docstring).
COPY_MODE_CASES = frozenset({
    "test_write_creates_parents_and_reads_back", "test_read_failures_have_codes",
    "test_list_dir_names_entries", "test_confinement_refuses_escapes",
    "test_commit_is_all_or_nothing", "test_stat_kinds",
    "test_walk_rule", "test_grep_reports_every_hit_and_counts_binary",
    "test_missing_root_is_an_error",
    "test_exit_codes_are_results", "test_each_command_gets_exactly_its_environment",
    "test_job_outlives_the_call_then_wait_returns_exit", "test_kill_ends_the_job",
    "test_commands_start_with_default_signals",
    "test_background_job_holding_the_pipe_is_killed_after_exit",
    "test_detach_then_wait_returns_a_fresh_result", "test_explicit_timeout_still_kills",
    "test_kill_minus_one_spares_the_session", "test_invalid_input_is_a_tool_error_and_the_session_lives",
})
"""A copy-mode sandbox's: a fork's child on every engine, a restored session on a remote one."""
BIND_MODE_CASES = COPY_MODE_CASES | {
    "test_symlinks_are_neither_followed_nor_listed", "test_symlink_escapes_are_refused",
    "test_fifo_is_refused_without_blocking", "test_write_keeps_mode_and_leaves_no_temp_files",
    "test_unconfined_write_resolves_like_the_kernel",
}
"""A bind-mode session's: the host dir's links, fifos and modes too (HostDirContract)."""


class TestPodmanRestoredSession(RestoredSession, ContainerBinding):
    engine = "podman"
    kept_cases = BIND_MODE_CASES


class TestPodmanRootlessRestoredSession(RestoredSession, ContainerBinding):
    engine = "podman-rootless"
    kept_cases = BIND_MODE_CASES


class TestDockerRestoredSession(RestoredSession, ContainerBinding):
    engine = "docker"
    kept_cases = BIND_MODE_CASES


class TestPodmanRemoteRestoredSession(RestoredSession, CopyModeBinding):
    engine = "podman-remote"
    kept_cases = COPY_MODE_CASES


class TestDockerRemoteRestoredSession(RestoredSession, CopyModeBinding):
    engine = "docker-remote"
    kept_cases = COPY_MODE_CASES


class TestPodmanForkedChild(ForkedChild, CopyModeBinding):
    engine = "podman"
    kept_cases = COPY_MODE_CASES


class TestPodmanRootlessForkedChild(ForkedChild, CopyModeBinding):
    engine = "podman-rootless"
    kept_cases = COPY_MODE_CASES


class TestDockerForkedChild(ForkedChild, CopyModeBinding):
    engine = "docker"
    kept_cases = COPY_MODE_CASES


class TestPodmanRemoteForkedChild(ForkedChild, CopyModeBinding):
    engine = "podman-remote"
    kept_cases = COPY_MODE_CASES


class TestDockerRemoteForkedChild(ForkedChild, CopyModeBinding):
    engine = "docker-remote"
    kept_cases = COPY_MODE_CASES
