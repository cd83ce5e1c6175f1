"""A local engine's fork whose parent wrote outside its workspace starts its children from one
image made for the fork (decision 512): every child sees the parent's layer, the children's
snapshots and restores still name the layer against the session's image (so a restore to a
snapshot taken before the parent wrote removes what the image holds, and a snapshot of a
child opens anywhere), the image goes with the last child, and the janitor takes the image of
a process that died (with its children's containers). What a hostile parent can leave in the
layer (links to host paths and to the workspace) is written into the image as links, never
followed on the host."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.backends.containers.engine.protocol import ContainerSpec, Hardening
from toolseam.backends.containers.janitor import janitor
from toolseam.backends.containers.labels import FORK_IMAGE_LABEL, OWNER_LABEL, owner_label
from toolseam.backends.snapshots.fork_base import FORK_BASES

from ..support.engines import ENGINES, IMAGE, backend, remove_shared, shared_dir
from ..support.sandbox_trees import run
from ..support.snapshot_stores import own_store

WRITABLE = Hardening(read_only_root=False)
PARENT_WRITES = ("printf '#!/bin/sh\\necho tool\\n' > /usr/local/bin/tool && chmod 755 "
                 "/usr/local/bin/tool && mkdir -p /opt/pkg && echo lib > /opt/pkg/lib.txt && "
                 "echo changed > /etc/debian_version && echo kept > /tmp/keep && "
                 "ln -s {outside} /opt/host-link && ln -s /workspace /opt/ws")
STATE = ("for f in /usr/local/bin/tool /opt/pkg/lib.txt /etc/debian_version /tmp/keep /opt/kid "
         "/opt/late; do if [ -e $f ]; then echo \"$f $(cat $f | head -1)\"; else echo \"$f "
         "gone\"; fi; done; readlink /opt/host-link /opt/ws || true")


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_store(tmp_path / "store", monkeypatch)


def _my_fork_images(tk: Toolkit) -> list[str]:
    engine = tk.backend.sandbox.engine  # type: ignore[attr-defined]
    return [image for image, labels in engine.labeled_images(FORK_IMAGE_LABEL)
            if labels.get(FORK_IMAGE_LABEL) == owner_label()]


def _container_image(tk: Toolkit) -> str:
    sandbox = tk.backend.sandbox  # type: ignore[attr-defined]
    found = sandbox.engine.dialect.inspect_container(sandbox.engine.client, sandbox.container)
    return str(found["Image"])


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_forks_children_start_from_one_image_of_the_parents_layer(
        engine: str, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("host's\n")
    async with Toolkit(backend(engine, str(workspace), hardening=WRITABLE)) as tk:
        image_version = await run(tk, "cat /etc/debian_version")
        before = await tk.snapshot("before the parent wrote outside")
        await run(tk, PARENT_WRITES.format(outside=outside))
        expected = await run(tk, STATE)
        kids = await tk.fork(3)
        children = [k for k in kids if isinstance(k, Toolkit)]
        assert len(children) == 3, kids
        try:
            made = _my_fork_images(tk)
            assert len(made) == 1, made  # one image for the fork, not one per child
            for kid in children:
                assert await run(kid, STATE) == expected
                assert _container_image(kid).removeprefix("sha256:") \
                    == made[0].removeprefix("sha256:")
            first, second, third = children
            # a child's snapshot carries the parent's part of the layer with its own
            await run(first, "rm -r /opt/pkg && echo kid > /opt/kid")
            mine = await first.snapshot("the first child's")
            mine_state = await run(first, STATE)
            assert "/usr/local/bin/tool #!/bin/sh" in mine_state and "/opt/kid kid" in mine_state
            assert "/opt/pkg/lib.txt gone" in mine_state
            await run(first, "rm /usr/local/bin/tool && echo late > /opt/late && "
                             "echo again > /etc/debian_version && mkdir -p /opt/pkg")
            await first.restore(mine)
            assert await run(first, STATE) == mine_state
            # a snapshot from before the parent wrote: what the fork's image holds goes too
            await second.restore(before)
            assert await run(second, STATE) == (
                f"/usr/local/bin/tool gone\n/opt/pkg/lib.txt gone\n/etc/debian_version "
                f"{image_version}/tmp/keep gone\n/opt/kid gone\n/opt/late gone\n")
            # the child's snapshot opens on a fresh sandbox of the session's image
            fresh_dir = shared_dir()
            try:
                async with Toolkit(backend(engine, str(fresh_dir), hardening=WRITABLE),
                                   snapshot=mine) as fresh:
                    assert await run(fresh, STATE) == mine_state
            finally:
                remove_shared(fresh_dir)
            # a grandchild: the child's layer (the parent's part in it) on an image of its own
            grand = await third.fork(1)
            assert isinstance(grand[0], Toolkit), grand
            async with grand[0] as grandchild:
                assert await run(grandchild, STATE) == expected
            assert await run(tk, STATE) == expected  # the parent is untouched by any of it
            assert outside.read_text() == "host's\n"
        finally:
            for kid in children:
                await kid.close()
        assert not FORK_BASES._bases
        # kept for the session's next fork: the same layer, the same image (decision 513)
        again = [k for k in await tk.fork(2) if isinstance(k, Toolkit)]
        assert _my_fork_images(tk) == made
        for kid in again:
            assert await run(kid, STATE) == expected
            await kid.close()
        await run(tk, "echo later > /opt/late")  # another layer: another image, the old gone
        later = [k for k in await tk.fork(1) if isinstance(k, Toolkit)]
        assert len(_my_fork_images(tk)) == 1 and _my_fork_images(tk) != made
        assert "/opt/late later" in await run(later[0], STATE)
        await later[0].close()
    assert _my_fork_images(tk) == []  # the image went with the session that kept it


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_fork_whose_parent_deleted_an_image_file_writes_the_layer_into_each_child(
        engine: str, workspace: Path) -> None:
    """A tar cannot carry a deletion: such a fork makes no image, and its children still see
    the parent's layer, the deleted name gone."""
    async with Toolkit(backend(engine, str(workspace), hardening=WRITABLE)) as tk:
        await run(tk, "mkdir -p /opt/pkg && echo lib > /opt/pkg/lib.txt && rm /etc/issue")
        kids = await tk.fork(1)
        assert isinstance(kids[0], Toolkit), kids
        async with kids[0] as kid:
            assert _my_fork_images(tk) == []
            assert await run(kid, "cat /opt/pkg/lib.txt; ls /etc/issue 2>/dev/null || "
                                  "echo gone") == "lib\ngone\n"


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_janitor_removes_the_fork_image_of_a_process_that_died(
        engine: str, workspace: Path) -> None:
    async with Toolkit(backend(engine, str(workspace), hardening=WRITABLE)) as tk:
        sandbox = tk.backend.sandbox  # type: ignore[attr-defined]
        engine_api = sandbox.engine
        dead = f"{socket.gethostname()}:999999:1.000"  # no such process
        helper = engine_api.create(ContainerSpec(
            image=IMAGE, name=f"toolseam-test-fork-image-{sandbox.session_id}",
            command=["/bin/true"], labels={OWNER_LABEL: owner_label()}, environment={},
            binds=[], hardening=WRITABLE))
        try:
            image = engine_api.commit(helper, (FORK_IMAGE_LABEL, dead))
        finally:
            engine_api.remove(helper)
        # the dead process's child, on that image: what makes the janitor look for images
        child = engine_api.create(ContainerSpec(
            image=image, name=f"toolseam-test-fork-child-{sandbox.session_id}",
            command=["/bin/true"], labels={OWNER_LABEL: dead}, environment={}, binds=[],
            hardening=WRITABLE))
        janitor(engine_api)  # (another worker's session start may run one first: the same)
        assert child not in [c for c, _ in engine_api.labeled(OWNER_LABEL)]
        assert not engine_api.image_exists(image)  # found by its label: the dead owner's
