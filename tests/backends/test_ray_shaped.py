"""``toolseam.integrations.ray_sandbox.create``: Ray's own sandbox shape on toolseam's engines
(issue 39, part 4; a remote session of the node's ``RemoteServer`` since issue 47), on the
session's real 3-node cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from toolseam.seam.errors import ConfigurationError

from ..support.ray_cluster import RAY_TESTS, RayTestCluster, resource
from ..support.timing import patience

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")

# written for ray.experimental.sandbox; only the import line differs
RAY_SHAPED_SCRIPT = '''
import sys
import ray
import toolseam.integrations.ray_sandbox as sandbox   # was: from ray.experimental import sandbox

ray.init(address=sys.argv[1])
image = sys.argv[2]


@ray.remote(num_cpus=0)
def rollout(sb, n):
    result = ray.get(sb.exec.remote(f"echo rollout {n}; echo $((n * n)) > out.txt", env={"n": str(n)}))
    assert result.exit_code == 0, result
    return result.stdout + ray.get(sb.read_file.remote("out.txt")).decode()


sandboxes = [sandbox.create(image=image, env={"MODE": "eval"}, workdir="/workspace/run")
             for _ in range(4)]
outputs = ray.get([rollout.remote(sb, n) for n, sb in enumerate(sandboxes)])
print("|".join(o.replace("\\n", " ").strip() for o in outputs))
first = sandboxes[0]
ray.get(first.write_file.remote("note.txt", "written"))
r = ray.get(first.exec.remote(["cat", "note.txt"]))
print(r.exit_code, r.stdout, round(r.duration_seconds) >= 0, r.duration_ms >= 0)
r = ray.get(first.exec.remote("echo $MODE; pwd; exit 7"))
print(r.exit_code, r.stdout.split())
print(ray.get(first.get_status.remote()).value)
for sb in sandboxes:
    ray.get(sb.delete.remote())
print(ray.get(first.get_status.remote()).value)
'''

pytestmark = RAY_TESTS


def test_a_script_written_for_rays_sandbox_runs_by_changing_its_import(
        ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    script = tmp_path / "rollouts.py"
    script.write_text(RAY_SHAPED_SCRIPT)
    # the script's own ray.init: Ray 2.60 keeps a loopback address as it is only when told
    # this machine runs no multi-machine cluster (toolseam's own connect does it by itself)
    done = subprocess.run([sys.executable, str(script), ray_cluster.address, IMAGE],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.getcwd(),
                               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines == ["rollout 0 0|rollout 1 1|rollout 2 4|rollout 3 9",
                     "0 written True True",
                     "7 ['eval', '/workspace/run']",
                     "RUNNING",
                     "TERMINATED"]


def test_the_docs_rollout_example_runs(ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    """docs/ray.md's Ray-shaped example, as written, against the test cluster."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "ray.md").read_text()
    marked = page.split("<!-- example: skip (runs in tests/backends/test_ray_shaped.py", 1)[1]
    marked = marked.split("```python\n", 1)[1]
    script = tmp_path / "example.py"
    script.write_text(marked.split("```", 1)[0])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd(),
                                            "RAY_ADDRESS": ray_cluster.address,
                                            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [f"0 ['seed={n}', 'reward={2 * n}']" for n in range(4)]


def test_a_sandbox_is_driven_only_through_its_handle(ray_cluster: RayTestCluster) -> None:
    import ray

    import toolseam.integrations.ray_sandbox as sandbox
    from toolseam.backends.agentlink.errors import map_seam_error
    from toolseam.backends.remote.codec import dumps, loads
    from toolseam.integrations import _ray_sandbox_calls as calls
    from toolseam.ray import cluster as ray_cluster_module

    ray_cluster_module.connect(ray_cluster.address)
    sb = sandbox.create(image=IMAGE, resources=resource("podman"), address=ray_cluster.address)
    deleted = False
    try:
        assert ray.get(sb.exec.remote("echo mine > f.txt")).exit_code == 0
        assert "secret" not in repr(sb) and sb._secret not in repr(sb) \
            and sb._owner not in repr(sb)
        # another job lists the node actors and sends the session's requests with its id but
        # not its secret: the same answer as for no session at all
        actor = ray.get_actor(ray_cluster_module.actor_name(sb.node_id),
                              namespace=ray_cluster_module.NAMESPACE)
        guessed = type("Guessed", (), {"sandbox_id": sb.sandbox_id, "_secret": "guessed",
                                       "_workdir": None, "_env": {}})()
        for name, args in (("exec", ("cat f.txt", None, None, None, None)),
                           ("read_file", ("f.txt",)), ("write_file", ("f.txt", "theirs"))):
            req = calls.request(guessed, calls.opened_info(sb), name, args)
            answer = loads(ray.get(actor.remote_call.remote(dumps((req, None)), "another-job")))
            assert answer[0] == "err"
            assert "answers this secret" in str(map_seam_error(answer[1]))
        closing = (sb.sandbox_id, "guessed", "close", (), {})
        answer = loads(ray.get(actor.remote_call.remote(dumps((closing, None)), "another-job")))
        assert answer[0] == "err" and "answers this secret" in str(map_seam_error(answer[1]))
        _the_kept_answer_is_only_the_secrets(ray, sb, actor)
        # the old Ray-shaped actor API and the generic seam call by name are gone
        assert not hasattr(actor, "call") and not hasattr(actor, "sb_exec")
        assert ray.get(sb.read_file.remote("f.txt")) == b"mine\n"  # still there, its own
        with pytest.raises(FileNotFoundError):
            ray.get(sb.read_file.remote("nothing-here"))
        ray.get(sb.delete.remote())
        deleted = True
        with pytest.raises(sandbox.SandboxNotFoundError):
            ray.get(sb.exec.remote("true"))
    finally:
        if not deleted:  # a failure above must not leave the session to the next tests
            ray.get(sb.delete.remote())


def _the_kept_answer_is_only_the_secrets(ray: Any, sb: Any, actor: Any) -> None:
    """The answer the node keeps under a direct call's token (for the holder's other
    processes) is refused to a wrong secret and given with the right one. A real token: a
    made-up one waits 30 s for its request (``kept_answers.ARRIVAL_S``) before the same
    refusal. Where this thread has no direct path to the node (a loaded machine can leave it
    on Ray's), that wait is what is checked."""
    from toolseam.backends.agentlink.errors import map_seam_error
    from toolseam.backends.remote.codec import loads
    from toolseam.integrations import _ray_sandbox_direct as direct

    assert ray.get(sb.exec.remote("true")).exit_code == 0  # this thread's link, made now
    held = getattr(direct._state, "links", {}).get(sb.sandbox_id)  # none: no link made here
    token = held.ahead[0][1] if held is not None and held.link is not None and held.ahead \
        else None
    assert ray.get(sb.exec.remote("cat f.txt")).stdout == "mine\n"  # sent under ``token``
    if token is not None and any(t == token for _, t in held.ahead):  # type: ignore[union-attr]
        token = None  # not sent the direct way after all
    refused = loads(ray.get(actor.remote_collect.remote(sb.sandbox_id, "guessed",
                                                        token or "t" * 32)))
    assert refused[0] == "err" and "not yours" in str(map_seam_error(refused[1]))
    if token is not None:  # the same token with the secret: the refusal was the secret's
        assert loads(ray.get(actor.remote_collect.remote(sb.sandbox_id, sb._secret, token))
                     )[0] == "ok"


def test_ttl_ends_a_sandbox_and_upload_download_cross_the_cluster(
        ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    import ray

    import toolseam.integrations.ray_sandbox as sandbox

    source = tmp_path / "in.bin"
    source.write_bytes(bytes(range(256)) * 64)
    # two sandboxes: the ttl's ends on its own while the other, without one, carries the
    # files (one sandbox with a ttl of 6 s did both, and ended mid-way under a CPU hog)
    timed = sandbox.create(image=IMAGE, ttl_seconds=3, resources=resource("rootless"),
                           address=ray_cluster.address)
    sb = sandbox.create(image=IMAGE, resources=resource("rootless"),
                        address=ray_cluster.address)
    try:
        ray.get(sb.upload_file.remote(str(source), "data/in.bin"))
        assert ray.get(sb.exec.remote("wc -c < data/in.bin")).stdout == "16384\n"
        ray.get(sb.download_file.remote("data/in.bin", str(tmp_path / "out.bin")))
        assert (tmp_path / "out.bin").read_bytes() == source.read_bytes()
        deadline = time.monotonic() + patience(20)
        while ray.get(timed.get_status.remote()) != sandbox.SandboxStatus.TERMINATED:
            assert time.monotonic() < deadline, "ttl_seconds did not end the sandbox"
            time.sleep(0.5)
        assert ray.get(sb.get_status.remote()) == sandbox.SandboxStatus.RUNNING  # not a fault
    finally:
        ray.get(sb.delete.remote())


def test_limits_a_node_cannot_enforce_refuse_the_sandbox_naming_the_node(
        ray_cluster: RayTestCluster) -> None:
    """Rootless podman on cgroups v1 (this machine) applies no memory limit: a sandbox asking
    for one is refused there rather than run unlimited."""
    import ray

    import toolseam.integrations.ray_sandbox as sandbox

    sb = sandbox.create(image=IMAGE, memory="256Mi", resources=resource("rootless"),
                        address=ray_cluster.address)
    with pytest.raises(sandbox.SandboxCreationError, match=r"node rootless .*limits"):
        ray.get(sb.exec.remote("true"))
    assert ray.get(sb.get_status.remote()) == sandbox.SandboxStatus.ERROR


def test_a_network_toolseam_does_not_offer_is_refused_naming_those_it_does() -> None:
    import toolseam.integrations.ray_sandbox as sandbox

    with pytest.raises(ConfigurationError, match="'none', 'public', 'bridge'"):
        sandbox.create(image=IMAGE, network="host")


@pytest.mark.parametrize(("ray_memory", "ours"), [
    ("512Mi", "512m"), ("1Gi", "1024m"), ("2G", "1907m"), (268435456, "256m"), ("64mib", "64m")])
def test_rays_memory_sizes_become_toolseams(ray_memory: str | int, ours: str) -> None:
    from toolseam.integrations.ray_sandbox import memory_limit

    assert memory_limit(ray_memory) == ours


def test_a_memory_that_is_no_size_is_refused_naming_it() -> None:
    from toolseam.integrations.ray_sandbox import memory_limit

    with pytest.raises(ConfigurationError, match="'lots'"):
        memory_limit("lots")


def test_a_shaped_exec_takes_the_direct_path_and_reports_a_measured_duration(
        ray_cluster: RayTestCluster) -> None:
    """Issue 46 item 3: in the driver that made it, exec/read_file/write_file go on the node's
    direct port (no Ray actor call per call), and ``duration_seconds`` is measured, not a
    whole-millisecond count (0.0 for a quick command)."""
    import ray

    import toolseam.integrations.ray_sandbox as sandbox
    from toolseam.integrations import _ray_sandbox_direct as shaped_direct

    sb = sandbox.create(image=IMAGE, resources=resource("docker"), address=ray_cluster.address)
    try:
        assert ray.get(sb.exec.remote("true")).exit_code == 0  # the creation is over now
        quick = ray.get(sb.exec.remote("true"))
        held = shaped_direct._state.links[sb.sandbox_id]
        assert held.link is not None and held.link.alive
        assert 0.0 < quick.duration_seconds < 5.0
        slow = ray.get(sb.exec.remote("sleep 0.3"))
        assert 0.3 <= slow.duration_seconds < 10.0
        before = len(held.ahead)
        ray.get(sb.write_file.remote("d.txt", "direct"))
        assert ray.get(sb.read_file.remote("d.txt")) == b"direct"
        assert len(held.ahead) in (before - 2, before - 2 + shaped_direct.AHEAD)  # used 2
        result = ray.get(sb.exec.remote("echo out; echo err >&2; exit 3"))
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
        # failures still surface at ray.get, as Ray's own kinds
        with pytest.raises(FileNotFoundError):
            ray.get(sb.read_file.remote("nothing-here"))
        with pytest.raises(sandbox.SandboxTimeoutError):
            ray.get(sb.exec.remote("sleep 30", timeout=0.5))
        # long commands handed to Ray still run side by side: each waits (up to 30 s) until
        # all three have started, which commands run one after another never see (a bound on
        # three `sleep 1` failed under a CPU hog at 2.8 s)
        refs = [sb.exec.remote(
            f"touch side-{n}; i=0; while [ $(ls side-* | wc -l) -lt 3 ] && [ $i -lt 300 ]; "
            f"do sleep 0.1; i=$((i+1)); done; ls side-* | wc -l; echo {n}") for n in range(3)]
        assert [r.stdout for r in ray.get(refs)] == ["3\n0\n", "3\n1\n", "3\n2\n"]
        assert held.link.alive  # none of this knocked the sandbox off the direct path
    finally:
        ray.get(sb.delete.remote())
    with pytest.raises(sandbox.SandboxNotFoundError):
        ray.get(sb.exec.remote("true"))


def test_a_shaped_sandbox_works_through_ray_where_its_holder_cannot_reach_the_node(
        ray_cluster: RayTestCluster) -> None:
    """A Ray task (another process) that cannot reach the node's direct port — here its
    ready answer names a port nobody listens on — runs its calls through Ray; a ref the
    driver got on the direct path reads the same in that task."""
    import socket

    import ray

    import toolseam.integrations.ray_sandbox as sandbox

    with socket.socket() as probe:  # a port that refuses: bound, never listening
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]

        @ray.remote(num_cpus=0)
        def elsewhere(sb: Any, passed: Any, port: int) -> tuple[Any, ...]:
            from toolseam.integrations import _ray_sandbox_direct as shaped_direct
            sb._ready = ray.put({"direct": ("127.0.0.1", port)})
            out = ray.get(sb.exec.remote("cat f.txt")).stdout
            link = shaped_direct._state.links[sb.sandbox_id].link
            return out, link, passed.stdout

        sb = sandbox.create(image=IMAGE, resources=resource("podman"),
                            address=ray_cluster.address)
        try:
            ray.get(sb.write_file.remote("f.txt", "through ray"))
            passed = sb.exec.remote("echo from the driver")
            out, link, seen = ray.get(elsewhere.remote(sb, passed, closed))
            assert (out, link, seen) == ("through ray", None, "from the driver\n")
        finally:
            ray.get(sb.delete.remote())


def test_a_dropped_sandboxs_direct_connection_is_closed(ray_cluster: RayTestCluster) -> None:
    """A sandbox dropped without delete() does not keep this process's connection to its
    node (the next new link closes it), and its node ends it after its orphan timeout: its
    lease is no longer renewed."""
    import gc

    import ray

    import toolseam.integrations.ray_sandbox as sandbox
    from toolseam.backends.agentlink.errors import map_seam_error
    from toolseam.backends.remote.codec import dumps, loads
    from toolseam.integrations import _ray_sandbox_direct as shaped_direct
    from toolseam.seam.models import PathRef

    def made() -> Any:
        sb = sandbox.create(image=IMAGE, resources=resource("rootless"), orphan_timeout_s=5,
                            address=ray_cluster.address)
        ray.get(sb.exec.remote("true"))  # the creation is over: the next call links
        assert ray.get(sb.exec.remote("echo linked")).stdout == "linked\n"
        return sb

    dropped = made()
    sid, link = dropped.sandbox_id, shaped_direct._state.links[dropped.sandbox_id].link
    stat = (sid, dropped._secret, "stat", (), {"ref": PathRef(base="/", path="/")})
    assert link is not None and link.alive
    del dropped
    gc.collect()
    kept = made()
    try:
        assert sid not in shaped_direct._state.links
        assert not link.alive
        assert shaped_direct._state.links[kept.sandbox_id].link is not None
        deadline = time.monotonic() + 30  # its orphan timeout is 5 s; the node reaps each second
        while True:
            answer = loads(ray.get(kept._actor.remote_call.remote(dumps((stat, None)), "probe",
                                                                  5)))
            if answer[0] == "err":
                break
            assert time.monotonic() < deadline, "a dropped sandbox outlived its orphan timeout"
            time.sleep(0.5)
        assert "answers this secret" in str(map_seam_error(answer[1]))
    finally:
        ray.get(kept.delete.remote())


def test_a_running_calls_ref_is_ready_for_ray_wait_only_once_the_call_ended(
        ray_cluster: RayTestCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A call still running after the direct path's grace returns a ref that ``ray.wait``
    reports ready only once the command ended (as an actor method's ref is), so the rollout
    pattern ``ready, rest = ray.wait(refs, num_returns=1, timeout=T)`` works."""
    import ray

    import toolseam.integrations.ray_sandbox as sandbox
    from toolseam.integrations import _ray_sandbox_direct as shaped_direct
    from toolseam.integrations import _ray_sandbox_waiter as waiter

    sb = sandbox.create(image=IMAGE, resources=resource("docker"), address=ray_cluster.address)
    try:
        assert ray.get(sb.exec.remote("true")).exit_code == 0  # the creation is over now
        assert ray.get(sb.exec.remote("true")).exit_code == 0  # linked: the direct path
        held = shaped_direct._state.links[sb.sandbox_id]
        monkeypatch.setattr(waiter, "_held", {})  # a waiter started below would be seen
        assert ray.get(sb.exec.remote("sleep 0.1; echo warm")).stdout == "warm\n"
        running = sb.exec.remote("sleep 2; echo x")
        short = sb.exec.remote("sleep 0.3; echo short")
        failing = sb.exec.remote("sleep 30", timeout=2)
        assert ray.wait([running, failing], num_returns=1, timeout=0.5) == (
            [], [running, failing])
        # as completed: the short call comes first although asked for second
        assert ray.wait([running, short], num_returns=1, timeout=60) == ([short], [running])
        assert ray.get(short).stdout == "short\n"
        assert ray.wait([running], timeout=60) == ([running], [])
        assert ray.get(running).stdout == "x\n"
        # a long call that fails was not ready before it ended, and raises Ray's own kind
        with pytest.raises(sandbox.SandboxTimeoutError):
            ray.get(failing)
        # a running call's ref read in another process reads the same there
        read_there = ray.remote(num_cpus=0)(lambda refs: ray.get(refs[0]).stdout)
        there = sb.exec.remote("sleep 0.5; echo there")
        assert ray.get(read_there.remote([there])) == "there\n"
        assert held.link is not None and held.link.alive  # all of it on the direct path
        assert waiter._held == {}, "a running call's ref is the node's collect (decision 511)"
    finally:
        ray.get(sb.delete.remote())


def test_a_call_through_ray_is_one_node_actor_call_read_in_rays_shape(
        ray_cluster: RayTestCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the direct path, once the creation is over, a call is the node actor's own
    (decision 511): no waiter actor is started, its ref is ready only once the command
    ended, its value is Ray's shape and its failures Ray's own kinds — and the same inside
    a running event loop (an async actor's method awaits the ref)."""
    import asyncio

    import ray

    import toolseam.integrations.ray_sandbox as sandbox
    from toolseam.integrations import _ray_sandbox_direct as shaped_direct
    from toolseam.integrations import _ray_sandbox_waiter as waiter

    monkeypatch.setenv(shaped_direct.OFF_VARIABLE, "0")
    monkeypatch.setattr(waiter, "_held", {})  # a waiter started here would be seen
    sb = sandbox.create(image=IMAGE, resources=resource("podman"), address=ray_cluster.address)
    try:
        assert ray.get(sb.write_file.remote("f.txt", "through ray")) is None
        assert waiter._held, "the first call, made while the creation ran, is the waiter's"
        monkeypatch.setattr(waiter, "_held", {})
        result = ray.get(sb.exec.remote("cat f.txt; echo err >&2; exit 3"))
        assert (result.exit_code, result.stdout, result.stderr) == (3, "through ray", "err\n")
        assert ray.get(sb.read_file.remote("f.txt")) == b"through ray"
        running = sb.exec.remote("sleep 1.5; echo late")
        assert ray.wait([running], timeout=0.5) == ([], [running])
        assert ray.get(running).stdout == "late\n"
        with pytest.raises(FileNotFoundError):
            ray.get(sb.read_file.remote("nothing-here"))
        with pytest.raises(sandbox.SandboxTimeoutError):
            ray.get(sb.exec.remote("sleep 30", timeout=0.5))

        async def in_a_loop() -> str:
            return str((await sb.exec.remote("echo from a loop")).stdout)

        assert asyncio.run(in_a_loop()) == "from a loop\n"
        assert waiter._held == {}, "a call after the creation started a waiter"
    finally:
        ray.get(sb.delete.remote())
