"""What only container backends must show (CONTRACT §2, §9), on every engine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from toolseam import ConfigurationError, CouldNotRunError, Toolkit
from toolseam.backends.containers.engine.protocol import Hardening
from toolseam.policy.limits import SandboxLimits

from ..support.engines import (
    ENGINES,
    IMAGE,
    REMOTE_ENGINES,
    backend,
    endpoint,
    remove_shared,
    serve_every_builtin,
    shared_dir,
)
from ..support.processes import host_started, host_survivors

REPO = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture(params=ENGINES)
async def toolkit(request: pytest.FixtureRequest, workspace: Path) -> AsyncIterator[Toolkit]:
    async with Toolkit(backend(request.param, str(workspace))) as tk:
        yield tk


async def test_posture_inside_the_sandbox(toolkit: Toolkit) -> None:
    probe = await toolkit.call("bash", {"command": (
        "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; ls /sys/class/net; "
        "ls /var/run/docker.sock /run/podman/podman.sock /run/docker.sock 2>&1 | grep -c 'No such'; "
        "touch /usr/probe 2>&1; touch /tmp/ok && echo tmp-writable; "
        "grep -c NoNewPrivs:.1 /proc/self/status")})
    lines = probe.output.splitlines()
    assert lines[:3] == ["CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
                         "CapBnd:\t0000000000000000"]
    assert lines[3] == "lo"  # no network interface but loopback
    assert lines[4] == "3"  # no engine socket anywhere
    assert "Read-only file system" in lines[5]
    assert lines[6:] == ["tmp-writable", "1"]


async def test_timeout_leaves_only_the_agent(toolkit: Toolkit) -> None:
    marker = f"{uuid.uuid4().int % 900 + 100}.75"
    result = await toolkit.call("bash", {"command": f"setsid sleep {marker} & sleep {marker} & sleep 60",
                                         "timeout": 500})
    assert result.metadata["timedOut"] and result.metadata["killedTree"]
    # the agent (pid 1 of the container) and its idle job roots, kept for the next call
    # (decision 345): nothing of the job
    processes = [p for p in _container_processes(toolkit) if p.strip() != "toolseam-job-root"]
    assert len(processes) == 1, processes
    assert "--toolseam-agent" in processes[0]
    assert host_survivors(f"sleep {marker}") == []


async def test_exit_126_from_the_user_is_a_result(toolkit: Toolkit) -> None:
    result = await toolkit.call("bash", {"command": "exit 126"})
    assert (result.output, result.metadata["exitCode"]) == ("\nbash: command exited with code 126", 126)
    assert "failure" not in result.metadata


@pytest.mark.parametrize("engine", ENGINES)
async def test_missing_image_is_could_not_run_fast(engine: str, workspace: Path) -> None:
    """pull never: a missing image is final at once. missing (the default): the pull is tried,
    and a registry that is not there is reported as such, retryable."""
    for pull, retryable, words in (("never", False, "pull policy: never"),
                                   ("missing", True, "could not pull")):
        started = time.monotonic()
        sandbox = backend(engine, str(workspace), image="localhost/toolseam-no-such-image:9",
                          pull=pull)
        with pytest.raises(CouldNotRunError) as caught:
            await sandbox.open()
        await sandbox.close()
        assert time.monotonic() - started < 5
        assert "localhost/toolseam-no-such-image:9" in caught.value.reason
        assert words in caught.value.reason
        assert caught.value.retryable is retryable


@pytest.mark.parametrize("engine", ENGINES)
async def test_wrong_engine_socket_names_the_endpoint(engine: str, workspace: Path) -> None:
    endpoint(engine)  # the engine itself must be configured for this test to mean anything
    from toolseam.backends.docker import DockerBackend
    from toolseam.backends.podman import PodmanBackend

    wrong = "unix:///run/toolseam/no-such-engine.sock"
    with pytest.raises(CouldNotRunError) as caught:
        await Toolkit(DockerBackend(str(workspace), endpoint=wrong) if engine == "docker"
                      else PodmanBackend(str(workspace), endpoint=wrong)).open()
    assert wrong in caught.value.reason and "unreachable" in caught.value.reason


@pytest.mark.parametrize("engine", ENGINES)
async def test_foreign_images_serve_every_builtin(engine: str, workspace: Path) -> None:
    """The agent brings its own runtime: an image with no python3, no bash — busybox alone,
    Debian without python, a musl userland — serves every builtin as the reference image does."""
    for image in FOREIGN_IMAGES:
        async with Toolkit(backend(engine, str(workspace), image=image, pull="never"),
                           base_dir="/workspace", confine_to_base_dir=True) as tk:
            has_python = await tk.call("bash", {"command": "command -v python3 || echo none"})
            assert has_python.output == "none\n", (image, has_python.output)
            results = await serve_every_builtin(tk, image)
            # no bash in the image: the catalog resolved sh, and the result says which ran
            assert results["bash"].metadata["shell"] == "/bin/sh -c"
            if "musl" in image:  # a musl userland, and no glibc in the image at all
                musl = await tk.call("bash", {"command": "hello-musl; ls /lib /lib64 2>&1"})
                assert musl.output.startswith("hello from musl\n"), musl.output
                assert "ld-musl-" in musl.output and "ld-linux" not in musl.output
        for path in workspace.iterdir():
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_shell_the_image_lacks_is_refused_and_nothing_runs(engine: str,
                                                                   workspace: Path) -> None:
    from toolseam import HostError, Settings

    tk = Toolkit(backend(engine, str(workspace), image=FOREIGN_IMAGES[0], pull="never"),
                 settings=Settings(shell_id="bash"))
    try:
        with pytest.raises(HostError) as caught:
            await tk.open()
    finally:
        await tk.close()
    assert "bash" in str(caught.value)


FOREIGN_IMAGES = ("localhost/toolseam-nopython:latest", "localhost/toolseam-debian-nopython:latest",
                  "localhost/toolseam-musl:latest")


@pytest.mark.parametrize("engine", ["podman", "docker"])  # rootless on cgroups v1 has no limits
async def test_memory_hog_is_ran_with_an_oom_indicator(engine: str, workspace: Path) -> None:
    sandbox = backend(engine, str(workspace),
                      hardening=Hardening(limits=SandboxLimits(memory="160m")))
    async with Toolkit(sandbox) as tk:
        hog = await tk.call("bash", {"command": "python3 -c \"x = b'a' * (600 << 20)\"; echo after"})
        assert hog.metadata.get("oomKilled") is True, hog
        assert hog.output.endswith("after\n") and "failure" not in hog.metadata
        assert not (await tk.call("bash", {"command": "true"})).is_error  # the sandbox lives on


@pytest.mark.parametrize("engine", ENGINES)
async def test_container_dying_is_could_not_run(engine: str, workspace: Path) -> None:
    sandbox = backend(engine, str(workspace))
    async with Toolkit(sandbox) as tk:
        container = sandbox.sandbox.container  # type: ignore[attr-defined]
        engine_cli = ["/usr/bin/docker"] if engine == "docker" else ["podman"]
        env = dict(os.environ)
        if engine == "podman-rootless":
            env["CONTAINER_HOST"] = endpoint(engine)
            engine_cli = ["podman", "--remote"]
        subprocess.run([*engine_cli, "kill", container], check=True, capture_output=True, env=env)
        result = await tk.call("bash", {"command": "true"})
        later = [await tk.call(tool, args) for tool, args in (
            ("bash", {"command": "true"}), ("read", {"path": "x"}), ("grep", {"pattern": "x"}))]
    assert result.is_error and result.metadata["failure"] == "could_not_run"
    assert "killed" in result.metadata["reason"] or "exited" in result.metadata["reason"]
    # retrying cannot succeed in this session: it says so, once and then on every call
    assert result.metadata["retryable"] is False
    assert result.metadata["reason"].endswith("this session is over (its sandbox is gone): "
                                              "start a new one")
    for again in later:
        assert again.metadata["failure"] == "could_not_run"
        assert (again.metadata["reason"], again.metadata["retryable"]) == (
            result.metadata["reason"], False)


@pytest.mark.parametrize("engine", ENGINES)
async def test_host_sigkill_then_janitor(engine: str, workspace: Path) -> None:
    marker = f"{uuid.uuid4().int % 900 + 100}.25"
    holder = subprocess.Popen([sys.executable, str(REPO / "tests/support/hold_job.py"), engine,
                               str(workspace), marker], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert holder.stdout is not None
    try:
        container = json.loads(holder.stdout.readline())["container"]
        assert host_started(f"sleep {marker}")
    finally:  # killed here, or by a failure above: never left running for the next test
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    deadline = time.monotonic() + 8  # the job's own deadline is 5 s
    while host_survivors(f"sleep {marker}") and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert host_survivors(f"sleep {marker}") == []
    fresh = backend(engine, str(workspace))
    await fresh.open()  # the janitor runs at start
    try:
        engine_api = fresh.sandbox.engine  # type: ignore[attr-defined]
        remaining = [c for c, _ in await asyncio.to_thread(engine_api.labeled, "toolseam.owner")]
        assert container not in remaining
    finally:
        await fresh.close()


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_rootless_files_belong_to_the_user(workspace: Path) -> None:
    user = os.environ.get("TOOLSEAM_ROOTLESS_USER", "")
    async with Toolkit(backend("podman-rootless", str(workspace))) as tk:
        await tk.call("write", {"path": "made/in/sandbox.txt", "content": "x"})
        await tk.call("bash", {"command": "echo y > from-bash.txt"})
    import pwd

    uid = pwd.getpwnam(user).pw_uid
    for made in (workspace / "made", workspace / "made/in/sandbox.txt", workspace / "from-bash.txt"):
        assert made.stat().st_uid == uid, made
    removed = subprocess.run(["su", "-s", "/bin/sh", user, "-c",
                              f"echo edited >> {workspace}/from-bash.txt && rm -r {workspace}/made"],
                             capture_output=True, text=True)
    assert removed.returncode == 0, removed.stderr
    assert not (workspace / "made").exists()


async def test_conformance_across_all_backends(tmp_path: Path) -> None:
    calls = [
        ("glob", {"pattern": "**/*", "limit": 4}), ("grep", {"pattern": "hit", "limit": 3}),
        ("read", {"path": "alpha/f.txt", "offset": 1, "limit": 1}),
        ("bash", {"command": "cat ms.txt; echo err >&2; exit 7"}),
        ("edit", {"path": "ms.txt", "oldString": "hit", "newString": "HIT"}),
        ("apply_patch", {"patchText": "*** Begin Patch\n*** Add File: new/p.txt\n+p\n*** End Patch"}),
        ("glob", {"pattern": "*.txt"}), ("read", {"path": "../escape"}),
    ]
    outputs = {}
    from toolseam.testing.contract import ORDER_FIXTURE

    for name in ("host", *ENGINES):
        workspace = shared_dir()
        for rel, data in ORDER_FIXTURE.items():
            (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
            (workspace / rel).write_bytes(data)
        for directory in [workspace, *workspace.rglob("*")]:
            if directory.is_dir():
                directory.chmod(0o777)
        sandbox = Toolkit("host", base_dir=str(workspace), confine_to_base_dir=True) if name == "host" \
            else Toolkit(backend(name, str(workspace)), base_dir="/workspace", confine_to_base_dir=True)
        async with sandbox as tk:
            results = []
            for tool, args in calls:
                result = (await tk.call(tool, args)).to_json()
                result["output"] = result["output"].replace(tk.base_dir, "<base>")
                for key in ("durationMs", "shell"):
                    result["metadata"].pop(key, None)
                results.append(result)
            outputs[name] = results
        remove_shared(workspace)
    for name, results in outputs.items():
        assert results == outputs["host"], name
    assert outputs["host"][7]["output"] == "read: ../escape resolves outside baseDir <base>"


@pytest.mark.parametrize("engine", ENGINES)
async def test_read_scope_works_on_sandbox_paths(engine: str, workspace: Path) -> None:
    from toolseam import ReadQuestion, Settings

    asked: list[ReadQuestion] = []

    def approver(question: ReadQuestion) -> str:
        asked.append(question)
        return "deny"

    (workspace / "in.txt").write_text("inside\n")
    async with Toolkit(backend(engine, str(workspace)), settings=Settings(read_scope="working-dir"),
                       approver=approver) as tk:
        assert (await tk.call("read", {"path": "in.txt"})).output.startswith("00001| inside\n")
        assert not (await tk.call("read", {"path": "/etc/hostname"})).is_error
        refused = await tk.call("read", {"path": "/var/lib/dpkg/status"})
        assert refused.is_error and refused.metadata == {"refused": True}
        tk.user_message("the package list is in /var/lib/dpkg, have a look")
        assert not (await tk.call("read", {"path": "/var/lib/dpkg/status"})).is_error
    assert [(q.path, q.workdir) for q in asked] == [("/var/lib/dpkg/status", "/workspace")]


@pytest.mark.parametrize("engine", ENGINES)
def test_cli_call_on_a_container_backend(engine: str, workspace: Path) -> None:
    endpoint(engine)
    (workspace / "hello.txt").write_text("from the host\n")
    option = ["--backend", "docker"] if engine == "docker" else ["--backend", "podman"]
    if engine == "podman-rootless":
        option.append("--rootless")
    done = subprocess.run([sys.executable, "-m", "toolseam.frontends.cli", "call", "bash",
                           '{"command": "pwd; cat hello.txt"}', *option, "--workspace", str(workspace),
                           "--image", IMAGE],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "/workspace\nfrom the host\n"


@pytest.mark.parametrize("engine", ENGINES)
async def test_limits_from_settings_reach_the_engine(engine: str, workspace: Path) -> None:
    """Settings.limits → the engine's own record of the container (inspect)."""
    from toolseam import SandboxLimits, Settings

    options: dict[str, object] = {"workspace": str(workspace), "endpoint": endpoint(engine),
                                  "image": IMAGE}
    if engine == "podman-rootless":
        options["rootless"] = True
    limits = SandboxLimits(memory="256m", cpus=0.5, pids=64, tmpfs_size="64m")
    if engine == "podman-rootless":  # cgroups v1 here: the engine accepts limits, then drops them
        tk = Toolkit("podman", settings=Settings(limits=limits), backend_options=options)
        try:
            refused = await tk.call("bash", {"command": "true"})
        finally:
            await tk.close()
        assert refused.metadata["failure"] == "could_not_run" and not refused.metadata["retryable"]
        assert "did not apply the limits memory=256m, pids=64, cpus=0.5" in refused.output
        assert not _containers_of(engine, tk.backend.sandbox.session_id)  # type: ignore[attr-defined]
        return
    async with Toolkit("docker" if engine == "docker" else "podman",
                       settings=Settings(limits=limits), backend_options=options) as tk:
        container = tk.backend.sandbox.container  # type: ignore[attr-defined]
        engine_cli = ["/usr/bin/docker"] if engine == "docker" else ["podman"]
        env = dict(os.environ)
        if engine == "podman-rootless":
            env["CONTAINER_HOST"] = endpoint(engine)
            engine_cli = ["podman", "--remote"]
        done = subprocess.run([*engine_cli, "inspect", container], check=True, capture_output=True,
                              env=env, text=True)
        host = json.loads(done.stdout)[0]["HostConfig"]
        tmp = await tk.call("bash", {"command": "df -k /tmp | tail -1"})
    assert host["Memory"] == 256 << 20
    assert host["PidsLimit"] == 64
    assert host["NetworkMode"] == "none"
    if engine == "docker":
        assert host["NanoCpus"] == 500_000_000
    else:
        assert (host["CpuQuota"], host["CpuPeriod"]) == (50_000, 100_000)
    assert tmp.output.split()[1] == str(64 * 1024)  # the tmpfs's size in KiB, seen inside


def _containers_of(engine: str, session: str) -> list[str]:
    engine_cli = ["/usr/bin/docker"] if engine == "docker" else ["podman"]
    env = dict(os.environ)
    if engine == "podman-rootless":
        env["CONTAINER_HOST"] = endpoint(engine)
        engine_cli = ["podman", "--remote"]
    done = subprocess.run([*engine_cli, "ps", "-aq", "--filter", f"label=toolseam.session={session}"],
                          check=True, capture_output=True, env=env, text=True)
    return done.stdout.split()


@pytest.mark.parametrize("engine", ENGINES)
async def test_missing_workspace_is_one_verdict_on_every_engine(engine: str, workspace: Path) -> None:
    """The same failure, the same kind and retryability on podman, rootless podman and docker."""
    gone = workspace / "does-not-exist"
    tk = Toolkit(backend(engine, str(gone)))
    try:
        result = await tk.call("bash", {"command": "true"})
    finally:
        await tk.close()
    assert result.metadata["failure"] == "could_not_run"
    assert result.metadata["retryable"] is False, result.metadata["reason"]
    assert str(gone) in result.metadata["reason"] or "bind source" in result.metadata["reason"]
    assert _containers_of(engine, tk.backend.sandbox.session_id) == []  # type: ignore[attr-defined]


def _container_processes(toolkit: Toolkit) -> list[str]:
    """The container's live processes, as its engine lists them (``top``)."""
    engine = toolkit.backend.name
    container = toolkit.backend.sandbox.container  # type: ignore[attr-defined]
    env = dict(os.environ)
    if engine == "docker":
        argv = ["/usr/bin/docker", "top", container, "-o", "pid,stat,args"]
    else:
        argv = ["podman", "top", container, "pid", "state", "args"]
        if engine == "podman-rootless":
            env["CONTAINER_HOST"] = endpoint(engine)
            argv.insert(1, "--remote")
    done = subprocess.run(argv, check=True, capture_output=True, env=env, text=True)
    rows = [line.split(None, 2) for line in done.stdout.splitlines()[1:] if line.strip()]
    return [row[2] for row in rows if len(row) == 3 and not row[1].startswith("Z")]


@pytest.mark.parametrize(("engine", "mode"), [*((e, "bind") for e in ENGINES),
                                              ("docker", "copy"), ("podman", "copy"),
                                              *((e, "auto") for e in REMOTE_ENGINES)])
async def test_a_command_cannot_reach_the_agents_channel(engine: str, mode: str,
                                                         workspace: Path) -> None:
    """In copy mode the channel is the agent's stdin/stdout: a command that could open
    /proc/AGENT/fd/1 could forge answers. The agent is not dumpable, so it cannot (regression:
    the write went through before)."""
    made = backend(engine, str(workspace), workspace_mode=mode)
    async with Toolkit(made) as tk:
        agent = tk.info.agent_pid if tk.info else None
        probe = await tk.call("bash", {"command": f"echo '{{\"id\": 2, \"ok\": true}}' > "
                                                  f"/proc/{agent}/fd/1 && echo WROTE; "
                                                  f"cat /proc/{agent}/environ >/dev/null && "
                                                  "echo READ; true"})
        assert "WROTE" not in probe.output and "READ" not in probe.output, probe.output
        assert probe.output.count("Permission denied") == 2, probe.output
        assert (await tk.call("bash", {"command": "echo fine"})).output == "fine\n"


@pytest.mark.parametrize("engine,mode", [(e, "copy") for e in ("docker", "podman", *REMOTE_ENGINES)]
                         + [("docker", "bind"), ("podman", "bind")])
async def test_download_never_follows_a_link(engine: str, mode: str, workspace: Path,
                                             tmp_path: Path) -> None:
    """Issue 18, point 6: podman's archive API follows a link (``o4 -> /etc`` delivered the
    container's /etc), docker's follows those on the way. Refused, naming the link."""
    async with Toolkit(backend(engine, str(workspace), workspace_mode=mode)) as tk:
        made = await tk.call("bash", {"command": "ln -s /etc o4; ln -s /etc d; mkdir real; "
                                                 "echo x > real/f; ln -s real alias"})
        assert not made.is_error
        for src, says in (("o4", "o4 is a symbolic link in the sandbox (to /etc)"),
                          ("d/hostname", "lies below d, which is a symbolic link"),
                          ("alias/f", "lies below alias, which is a symbolic link")):
            with pytest.raises(ConfigurationError, match=re.escape(says)):
                await tk.download(src, str(tmp_path / src.replace("/", "-")))
        await tk.download("real", str(tmp_path / "real"))
        with pytest.raises(ConfigurationError, match="does not exist"):
            await tk.download("nothing", str(tmp_path / "nothing"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["real"]
    assert (tmp_path / "real" / "f").read_text() == "x\n"


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_sync_while_a_build_writes_is_retried_never_raw(engine: str, workspace: Path) -> None:
    """Issue 18, point 3/D: an archive read while files are rewritten comes back cut short
    (a raw ``tarfile.ReadError`` before). Each sync is retried (bounded): it brings the work
    home, or says could-not-run, retryable — nothing else."""
    made = backend(engine, str(workspace), workspace_mode="copy")
    outcomes: list[str] = []
    async with Toolkit(made) as tk:
        writer = asyncio.create_task(tk.call("bash", {"timeout": 9000, "command": (
            "mkdir -p out; while true; do for i in 1 2 3; do "
            "head -c 30000000 /dev/zero > out/f$i; done; done")}))
        await asyncio.sleep(1)
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            try:
                await made.sync()  # type: ignore[attr-defined]
                outcomes.append("ok")
            except CouldNotRunError as exc:
                assert exc.retryable, exc.reason
                outcomes.append("retryable")
        await writer
        # once nothing writes, the work comes home (a ratio of ok syncs under the writer was
        # tried here and proved a measure of the machine's load, not of the code)
        await made.sync()  # type: ignore[attr-defined]
    assert outcomes and set(outcomes) <= {"ok", "retryable"}, outcomes
    assert sorted(p.name for p in (workspace / "out").iterdir()) == ["f1", "f2", "f3"]


@pytest.mark.engines  # needs an engine without naming it in a parameter
@pytest.mark.parametrize("keep", [False, True])
async def test_copy_keep_group_write_reaches_the_copy_back(keep: bool, workspace: Path) -> None:
    """The backend option H1's copy-back policy reads: group/other write bits come home only
    when asked for; set-id bits never."""
    made = backend("docker", str(workspace), workspace_mode="copy", copy_keep_group_write=keep)
    async with Toolkit(made) as tk:
        await tk.call("bash", {"command": "echo x > shared.txt; chmod 0666 shared.txt; "
                                          "mkdir team; chmod 0777 team; cp /bin/true t; "
                                          "chmod 4777 t 2>/dev/null; chmod 0777 t"})
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in workspace.iterdir()}
    assert modes == ({"shared.txt": 0o666, "team": 0o777, "t": 0o777} if keep else
                     {"shared.txt": 0o644, "team": 0o755, "t": 0o755})
