"""docs/ray.md's "Starting a cluster", run as written (issue 46, item 5): the head and a second
node started the way the page says — token authentication, loopback only — a ``RayBackend``
connected to ``127.0.0.1:PORT`` runs a command on each node, nothing of the cluster listens
beyond loopback, and the page's stop ends that cluster and nothing else.

Only what must differ on a machine the suite shares is changed: every port of the page is
swapped for one of this test's own (the suite's cluster, tests/support/ray_cluster.py, and
other helpers' run beside it), HOME is a temp dir (the token the page makes would otherwise
land in this user's ~/.ray and change every other cluster of the machine), and ``ray`` /
``python`` on the PATH are this checkout's.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from ..support.doc_examples import ROOT, page_examples
from ..support.ray_cluster import RAY_TESTS, RayTestCluster

pytestmark = RAY_TESTS

PAGE = ROOT / "docs" / "ray.md"
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
PAGE_IMAGE = "localhost/toolseam-sandbox:latest"
PAGE_ROOTLESS = "unix:///run/user/1001/podman/podman.sock"

DRIVER = textwrap.dedent('''
    import asyncio, json, sys
    from toolseam import Toolkit
    from toolseam.ray import RayBackend

    async def main():
        seen = {}
        for name, resources in (("gpu-box", {"sandbox-gpu": 1}),
                                ("head", {"node:__internal_head__": 0.001})):
            backend = RayBackend(resources=resources, address=sys.argv[1])
            async with Toolkit(backend) as tk:
                out = (await tk.call("bash", {"command": "echo ran on $((6 * 7))"})).output
                seen[name] = [out.strip(), backend.where]
        print(json.dumps(seen))

    asyncio.run(main())
''')


def _recipe_blocks() -> tuple[str, str]:
    ours = [e.code for e in page_examples(PAGE) if "test_ray_recipe.py" in (e.skip or "")]
    assert len(ours) == 2, "docs/ray.md: the start and the stop block of 'Starting a cluster'"
    return ours[0], ours[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _own_ports(code: str) -> tuple[str, int]:
    """The page's code with each of its ports replaced by one of this test's; the GCS port."""
    base = random.randrange(20000, 30000, 200)  # worker port ranges below the ephemeral range
    swaps = {"6379": _free_port(), "8265": _free_port(), "52365": _free_port(),
             "52366": _free_port(), "10001": _free_port(), "10002": base,
             "10999": base + 99, "11000": base + 100, "11999": base + 199}
    for page_port, ours in swaps.items():
        assert f" {page_port}" in code or f":{page_port}" in code, page_port
        code = code.replace(f" {page_port}", f" {ours}").replace(f":{page_port}", f":{ours}")
    return code, swaps["6379"]


def _environment(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "ray").write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; from ray.scripts.scripts import '
        f'main; sys.argv[0] = \'ray\'; sys.exit(main())" "$@"\n')
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    (tmp_path / "home").mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RAY_", "TOOLSEAM_RAY_"))}
    return {**env, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT),
            "PATH": os.pathsep.join([str(bin_dir), env.get("PATH", "")])}


def _cluster_processes(ray_dir: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(ray_dir in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


def _listening(processes: list[psutil.Process]) -> set[str]:
    addresses = set()
    for process in processes:
        try:
            for connection in process.net_connections(kind="inet"):
                if connection.status == psutil.CONN_LISTEN:
                    addresses.add(f"{connection.laddr.ip} ({process.name()})")
        except psutil.NoSuchProcess:
            continue
    return addresses


def test_the_pages_cluster_recipe_runs_on_loopback_and_stops_only_itself(
        tmp_path: Path, ray_cluster: RayTestCluster) -> None:
    start, stop = _recipe_blocks()
    start, port = _own_ports(start)
    start = start.replace(PAGE_IMAGE, os.environ.get("TOOLSEAM_IMAGE", PAGE_IMAGE))
    start = start.replace(PAGE_ROOTLESS,
                          os.environ.get("TOOLSEAM_PODMAN_ROOTLESS_URL", PAGE_ROOTLESS))
    env = _environment(tmp_path)
    (tmp_path / "start.sh").write_text(start + f'echo "$RAY_DIR" > {tmp_path}/ray_dir\n')
    (tmp_path / "stop.sh").write_text(stop)
    ray_dir = ""
    try:
        started = subprocess.run(["bash", "-e", "-o", "pipefail", "start.sh"], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=240)
        ray_dir = (tmp_path / "ray_dir").read_text().strip() if started.returncode == 0 else ""
        assert started.returncode == 0, f"{started.stdout}\n{started.stderr}"
        assert (tmp_path / "home" / ".ray" / "auth_token").exists()

        began = time.monotonic()
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, f"127.0.0.1:{port}"], cwd=tmp_path,
            env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=240)
        assert driver.returncode == 0, driver.stderr[-3000:]
        seen = json.loads(driver.stdout.strip().splitlines()[-1])
        assert seen["gpu-box"][0] == seen["head"][0] == "ran on 42"
        assert "node gpu-box" in seen["gpu-box"][1] and "node head" in seen["head"][1]
        print(f"the driver connected and ran both sessions in {time.monotonic() - began:.1f} s")

        processes = _cluster_processes(ray_dir)
        assert {p.name() for p in processes} >= {"gcs_server", "raylet"}
        beyond = {a for a in _listening(processes) if a.split(" ")[0] not in LOOPBACK}
        assert beyond == set(), f"listening beyond loopback: {sorted(beyond)}"

        stopped = subprocess.run(["bash", "-e", "stop.sh"], cwd=tmp_path,
                                 env={**env, "RAY_DIR": ray_dir}, capture_output=True,
                                 text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert _cluster_processes(ray_dir) == []
        assert not Path(ray_dir).exists()
        # the suite's own cluster, started before, is untouched
        from toolseam.ray import cluster
        ray = cluster.connect(ray_cluster.address)
        assert len(cluster.alive_nodes(ray)) >= len(ray_cluster.nodes)
    finally:
        if ray_dir:  # what the page's stop did not end (a failed step above): end it here
            for process in _cluster_processes(ray_dir):
                process.kill()

