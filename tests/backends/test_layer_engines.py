"""The container's writable layer outside /workspace in a snapshot, on every engine (issue 48,
decision 440): a package-like file in /usr/local/bin, files in /tmp and /opt, files of the image
a command deleted — before the snapshot (deleted again by a restore) and after it (back) —
and a fork's children opening with their parent's layer. What a hostile command can put
there: a link (kept as a link, never followed), a fifo (left out, said), a set-id file (its
bits dropped), more bytes than the limit (nothing kept)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.backends.containers.engine.protocol import Hardening
from toolseam.backends.snapshots import SnapshotStore
from toolseam.backends.snapshots.capture import SnapshotLimitError

from ..support.engines import ALL_ENGINES, backend
from ..support.sandbox_trees import run
from ..support.snapshot_stores import count_ingested

WRITABLE = Hardening(read_only_root=False)  # a root a command can install packages into


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(root))
    return root


async def _state(tk: Toolkit) -> str:
    """What the test checks of the layer, as the sandbox's commands see it."""
    return await run(tk, (
        "for f in /usr/local/bin/tool /tmp/keep /opt/pkg/lib.txt /etc/debian_version "
        "/etc/issue /tmp/new /opt/late; do if [ -e $f ]; then echo \"$f $(stat -c %a $f) "
        "$(cat $f)\"; else echo \"$f gone\"; fi; done"))


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_the_layer_outside_the_workspace_is_what_a_restore_brings_back(
        engine: str, workspace: Path) -> None:
    async with Toolkit(backend(engine, str(workspace), hardening=WRITABLE)) as tk:
        await run(tk, "printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/tool && "
                      "chmod 755 /usr/local/bin/tool && echo kept > /tmp/keep && "
                      "mkdir -p /opt/pkg && echo lib > /opt/pkg/lib.txt && rm /etc/issue")
        image_version = await run(tk, "cat /etc/debian_version")
        snap = await tk.snapshot("installed")
        assert snap.deleted_outside == ["etc/issue"], snap
        assert snap.outside_workspace >= 6, snap  # tmp, tmp/keep, usr/local/bin/tool, opt/pkg…
        expected = await _state(tk)
        assert "/usr/local/bin/tool 755 #!/bin/sh" in expected
        assert "/etc/issue gone" in expected
        await run(tk, "rm /usr/local/bin/tool && rm -r /opt/pkg && echo new > /tmp/new && "
                      "echo late > /opt/late && rm /etc/debian_version && echo back > /etc/issue "
                      "&& echo rewritten > /tmp/keep")
        await tk.restore(snap)
        assert await _state(tk) == expected
        assert await run(tk, "tool") == "tool\n"  # the "package" runs again
        assert await run(tk, "cat /etc/debian_version") == image_version  # the image's, back


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_a_fork_child_opens_with_its_parents_layer(engine: str, workspace: Path) -> None:
    async with Toolkit(backend(engine, str(workspace), hardening=WRITABLE)) as tk:
        await run(tk, "echo parent > /tmp/keep && echo tool > /usr/local/bin/tool && "
                      "rm /etc/issue")
        kids = await tk.fork(2)
        children = [k for k in kids if isinstance(k, Toolkit)]
        assert len(children) == 2, kids
        try:
            for number, kid in enumerate(children):
                assert await run(kid, "cat /tmp/keep /usr/local/bin/tool; ls /etc/issue "
                                      "2>&1 || true") == (
                    "parent\ntool\nls: cannot access '/etc/issue': No such file or directory\n")
                await run(kid, f"echo {number} > /tmp/keep")
            assert [await run(k, "cat /tmp/keep") for k in children] == ["0\n", "1\n"]
            assert await run(tk, "cat /tmp/keep") == "parent\n"  # independent of its children
        finally:
            for kid in children:
                await kid.close()


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_a_read_only_root_still_carries_tmp(engine: str, workspace: Path) -> None:
    """The default hardening: only /tmp (a tmpfs no engine diff sees) is writable outside."""
    async with Toolkit(backend(engine, str(workspace))) as tk:
        await run(tk, "mkdir /tmp/d && echo one > /tmp/d/f && ln -s /etc/passwd /tmp/l")
        snap = await tk.snapshot()
        await run(tk, "rm -r /tmp/d /tmp/l && echo added > /tmp/added")
        await tk.restore(snap)
        assert await run(tk, "cat /tmp/d/f; readlink /tmp/l; ls /tmp") == (
            "one\n/etc/passwd\nd\nl\n")


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_what_a_hostile_command_leaves_outside_the_workspace(
        engine: str, workspace: Path, tmp_path: Path) -> None:
    """A link to a host path (bind mode shares one) is kept as a link and never followed by the
    host; a fifo is left out and said; a set-id file comes back without its bits; a layer
    larger than the limit is refused and nothing of it stays in the store."""
    outside = tmp_path / "outside"
    outside.write_text("host's\n")
    async with Toolkit(backend(engine, str(workspace), hardening=WRITABLE)) as tk:
        await run(tk, f"ln -s {outside} /tmp/host-link && ln -s /workspace /opt/ws && "
                      "mkfifo /tmp/fifo && echo x > /opt/suid && chmod 755 /opt/suid && "
                      "(chmod 4755 /opt/suid || true)")
        snap = await tk.snapshot()
        assert "/tmp/fifo" in snap.left_out, snap
        await run(tk, "rm /tmp/host-link /opt/ws /opt/suid")
        await tk.restore(snap)
        assert await run(tk, "readlink /tmp/host-link /opt/ws; stat -c %a /opt/suid; "
                             "ls /tmp") == f"{outside}\n/workspace\n755\nhost-link\n"
        assert outside.read_text() == "host's\n"
        await run(tk, "head -c 3000000 /dev/zero > /opt/big")
        before = sorted(p.name for p in (SnapshotStore().root / "objects").rglob("*")
                        if p.is_file())
        with pytest.raises(SnapshotLimitError):
            await tk.backend.snapshot_files(  # type: ignore[attr-defined]
                tk.base_dir, None, tk.session_id, 1_000_000)
        assert sorted(p.name for p in (SnapshotStore().root / "objects").rglob("*")
                      if p.is_file()) == before
        assert await run(tk, "ls -a /workspace") == ".\n..\n"  # no working file left there


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_a_second_snapshot_reads_only_the_layers_files_that_changed(
        engine: str, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workspace's rule for the layer: a file whose (inode, size, mtime, ctime) is what the
    previous snapshot stored is not sent again; one rewritten since is (and a restore from
    the first snapshot brings the first bytes back)."""
    read = count_ingested(monkeypatch)
    async with Toolkit(backend(engine, str(workspace), hardening=WRITABLE)) as tk:
        await run(tk, "head -c 2000000 /dev/urandom > /opt/big && echo one > /tmp/small")
        first = await tk.snapshot()
        assert sum(read) >= 2_000_000
        read.clear()
        await run(tk, "echo two > /tmp/small")
        await tk.snapshot()
        assert 0 < sum(read) < 1000, sum(read)  # /tmp/small only
        before = await run(tk, "md5sum /opt/big")
        await run(tk, "head -c 2000000 /dev/urandom > /opt/big")
        await tk.restore(first)
        assert await run(tk, "md5sum /opt/big; cat /tmp/small") == before + "one\n"
        # a restore writes only the layer's files that differ (decision 489): /opt/big stays
        # in place, the same inode, and /tmp/small alone is copied out of the store
        inode = await run(tk, "stat -c %i /opt/big")
        copied: list[str] = []
        copy_out = SnapshotStore.copy_out

        def counting(self: SnapshotStore, digest: str, fd: int) -> None:
            copied.append(digest)
            copy_out(self, digest, fd)
        monkeypatch.setattr(SnapshotStore, "copy_out", counting)
        await run(tk, "echo three > /tmp/small && mkdir /tmp/new && echo n > /tmp/new/f")
        result = await tk.restore(first)
        assert (len(copied), result.written) == (1, 1), (copied, result)
        assert await run(tk, "stat -c %i /opt/big; md5sum /opt/big; cat /tmp/small; ls /tmp"
                         ) == inode + before + "one\nsmall\n"
        read.clear()
        await tk.snapshot()  # what the restore kept in place is known: only /tmp/small is sent
        assert 0 < sum(read) < 1000, sum(read)
