"""Branching sessions (issue 48), every backend side by side in ONE run:

    set -a; . ./.engines.env; set +a      # engine endpoints (scripts/setup-engines.sh)
    python benchmarks/branch.py [--files 5000] [--mib 200] [--children 8] [--small-mib 20]
                                [--backends host,podman,podman-rootless,docker,podman-remote,docker-remote]

For a workspace of FILES files holding MIB MiB (random bytes, 20 directories), with a store of
its own (TOOLSEAM_SNAPSHOTS in a temp dir, removed after), on each backend:

* the first ``snapshot()`` (everything stored) and one after a single changed file;
* ``restore()`` after a single changed file;
* ``fork(N)``: from the call until every child has answered its first ``bash true``, while the
  parent keeps calling ``bash true`` — the parent's longest call during the fork is reported;
* the same ``fork(N)`` at ``--small-mib`` (the size dependence; host only: ``--small-all``
  for every backend);
* disk: what N children that each write 1 MiB and take a snapshot add to the store;
* for scale: N fresh (empty) sessions of the backend opened at once — what starting N
  sandboxes costs on this machine now, the floor under any fork;
* the engines' writable layer (decision 440; ``--outside-mib``, 0 to skip): on a sandbox
  whose root is writable, the same snapshot, restore and fork with nothing and with
  OUTSIDE_MIB MiB (1 MiB files in ``/opt/outside``) written outside the workspace — the cost
  the layer adds. ``--layer-only`` measures only that.
* ``--snapshot-only``: only the snapshots and the restore (no fork, no layer, no floor) — the
  copy-mode rows of decision 467 in a few minutes; with ``--layer-only``, the layer's rows
  without their forks.
* ``--ray``: a column more, ``fork(--ray-children)`` (12) of a session on a three-node Ray
  cluster of its own (``benchmarks/branch_ray.py``; run it under ``flock /tmp/ray-tests.lock``,
  one cluster at a time). ``--backends ''`` with it measures only that.

The local engines run in bind mode, the remote ones (their own mount namespaces, over TCP) in
copy mode; every fork's children are copy-mode sandboxes (docs/branching.md) — on the local
engines with a copy-on-write ``/workspace``, an overlay over a base restored once per fork
(decision 507).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from branch_ray import measure_ray  # benchmarks/ is the script's own directory

from toolseam import Toolkit
from toolseam.seam.protocol import BuiltinExec

BACKENDS = ("host", "podman", "podman-rootless", "docker", "podman-remote", "docker-remote")


def make_backend(name: str, workspace: str, writable_root: bool = False) -> BuiltinExec | str:
    """The backend ``name`` on ``workspace``, endpoints as the tests take them (.engines.env)."""
    if name == "host":
        return "host"
    from toolseam.backends.containers.engine.attach import TlsFiles
    from toolseam.backends.containers.engine.protocol import Hardening
    from toolseam.backends.docker import DockerBackend
    from toolseam.backends.podman import PodmanBackend

    image = os.environ["TOOLSEAM_REMOTE_IMAGE" if name.endswith("-remote") else "TOOLSEAM_IMAGE"]
    hardening = Hardening(read_only_root=not writable_root)
    if name == "docker":
        return DockerBackend(workspace, image=image, endpoint=os.environ["TOOLSEAM_DOCKER_URL"],
                             hardening=hardening)
    if name == "docker-remote":
        return DockerBackend(workspace, image=image,
                             endpoint=os.environ["TOOLSEAM_REMOTE_DOCKER_URL"],
                             tls=TlsFiles.from_dir(os.environ["TOOLSEAM_REMOTE_DOCKER_CERT_PATH"]),
                             hardening=hardening)
    variable = {"podman": "TOOLSEAM_PODMAN_URL", "podman-rootless": "TOOLSEAM_PODMAN_ROOTLESS_URL",
                "podman-remote": "TOOLSEAM_REMOTE_PODMAN_URL"}[name]
    return PodmanBackend(workspace, image=image, endpoint=os.environ[variable],
                         rootless=name == "podman-rootless", hardening=hardening)


def open_toolkit(name: str, workspace: Path) -> Toolkit:
    backend = make_backend(name, str(workspace))
    return Toolkit(backend, base_dir=workspace) if backend == "host" else Toolkit(backend)


class Clock:
    """Wall and this process's CPU seconds (all threads) since it was made: on a shared, loaded
    machine the CPU figure is the steadier of the two."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def ms(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 1000:.0f} ms ({pair[1] * 1000:.0f} ms CPU here)"


def make_workspace(root: Path, files: int, mib: int) -> None:
    each = (mib << 20) // files
    for number in range(files):
        folder = root / f"d{number % 20:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{number:05d}.bin").write_bytes(os.urandom(each))


def store_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "objects").rglob("*") if p.is_file())


async def timed_fork(tk: Toolkit, children: int) -> tuple[float, float]:
    """Seconds until every child answered ``bash true``; the parent's longest call meanwhile."""
    longest = 0.0
    done = asyncio.Event()

    async def parent_calls() -> None:
        nonlocal longest
        while not done.is_set():
            began = time.perf_counter()
            await tk.call("bash", {"command": "true"})
            longest = max(longest, time.perf_counter() - began)

    async def fork_and_answer() -> list[Toolkit]:
        kids = [k for k in await tk.fork(children) if isinstance(k, Toolkit)]
        await asyncio.gather(*(k.call("bash", {"command": "true"}) for k in kids))
        return kids

    calls = asyncio.ensure_future(parent_calls())
    began = time.perf_counter()
    kids = await fork_and_answer()
    elapsed = time.perf_counter() - began
    done.set()
    await calls
    for kid in kids:
        await kid.close()
    return elapsed, longest


async def forks_of(tk: Toolkit, args: argparse.Namespace
                   ) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """The session's first fork, then ``--repeat`` - 1 (at least one) more, each after one
    file of the workspace changed (an agent's step between two forks): the next fork brings
    the base the session kept up to date by what changed (decision 513)."""
    first = await timed_fork(tk, args.children)
    nexts = []
    for round_ in range(max(1, args.repeat - 1)):
        await tk.call("write", {"path": "step.txt", "content": f"step {round_}\n"})
        nexts.append(await timed_fork(tk, args.children))
    return first, nexts


async def fresh_opens(name: str, scratch: Path, children: int) -> float:
    began = time.perf_counter()
    fresh = [open_toolkit(name, shared(scratch, f"fresh-{name}-{n}-{time.monotonic_ns()}"))
             for n in range(children)]
    await asyncio.gather(*(t.call("bash", {"command": "true"}) for t in fresh))
    elapsed = time.perf_counter() - began
    for tk in fresh:
        await tk.close()
    return elapsed


def shared(scratch: Path, name: str) -> Path:
    """A directory a rootless engine's user can reach and write."""
    path = scratch / name
    path.mkdir()
    path.chmod(0o777)
    return path


async def measure_layer(name: str, args: argparse.Namespace, scratch: Path) -> dict[str, str]:
    """Snapshot, restore and fork with nothing, then ``--outside-mib`` MiB, outside the
    workspace of a sandbox whose root is writable (the layer's added cost)."""
    row: dict[str, str] = {}
    ws = shared(scratch, f"layer-{name}")
    make_workspace(ws, args.files, args.mib)
    for folder in ws.iterdir():
        folder.chmod(0o777)
        for item in folder.iterdir():
            item.chmod(0o666)
    for outside in (0, args.outside_mib):
        # a session each: its first fork makes its base (and start image) from nothing
        async with Toolkit(make_backend(name, str(ws), writable_root=True)) as tk:
            if outside:
                await tk.call("bash", {"command": (
                    f"mkdir -p /opt/outside && for i in $(seq {outside}); do head -c 1048576 "
                    "/dev/urandom > /opt/outside/f$i; done")})
            label = f"{outside} MiB outside"
            clock = Clock()
            first = await tk.snapshot()
            row[f"{label}: first snapshot"] = ms(clock.read())
            await tk.call("bash", {"command": "echo one > /opt/one-change"})
            clock = Clock()
            await tk.snapshot()
            row[f"{label}: snapshot after 1 change"] = ms(clock.read())
            await tk.call("bash", {"command": "echo again > /opt/one-change"})
            clock = Clock()
            await tk.restore(first)
            row[f"{label}: restore after 1 change"] = ms(clock.read())
            if args.snapshot_only:
                continue
            first_fork, next_forks = await forks_of(tk, args)
            row[f"{label}: fork({args.children}) to every first answer"] = (
                f"{first_fork[0]:.2f} s")
            row[f"{label}: the session's next fork, 1 change since"] = (
                f"{statistics.median(f[0] for f in next_forks):.2f} s")
    shutil.rmtree(ws, ignore_errors=True)
    return row


async def measure(name: str, args: argparse.Namespace, scratch: Path, store: Path
                  ) -> dict[str, str]:
    row: dict[str, str] = {}
    if name != "host" and args.outside_mib and (args.layer_only or not args.snapshot_only):
        row.update(await measure_layer(name, args, scratch))
    if args.layer_only:
        return row
    sizes = (args.mib, args.small_mib) if name == "host" or args.small_all else (args.mib,)
    if args.snapshot_only:
        sizes = (args.mib,)
    for mib in sizes:
        ws = shared(scratch, f"ws-{name}-{mib}")
        make_workspace(ws, args.files, mib)
        for folder in ws.iterdir():  # a rootless engine's root may change them too
            folder.chmod(0o777)
            for item in folder.iterdir():
                item.chmod(0o666)
        async with open_toolkit(name, ws) as tk:
            clock = Clock()
            first = await tk.snapshot()
            cold = clock.read()
            row["first snapshot"] = ms(cold)
            if not args.snapshot_only:
                first_fork, next_forks = await forks_of(tk, args)
                fork_s = first_fork[0]
                next_s = statistics.median(f[0] for f in next_forks)
                pause = max(f[1] for f in [first_fork, *next_forks])
                if mib != args.mib:
                    row[f"fork({args.children}) at {mib} MiB"] = f"{fork_s:.2f} s"
                    row[f"next fork at {mib} MiB, 1 change since"] = f"{next_s:.2f} s"
                    continue
                row[f"fork({args.children}) to every first answer"] = f"{fork_s:.2f} s"
                row["the session's next fork, 1 change since"] = f"{next_s:.2f} s"
                row["parent's longest call meanwhile"] = f"{pause * 1000:.0f} ms"
            snaps, restores = [], []
            for round_ in range(args.repeat):
                payload = os.urandom(4096) + bytes([round_])
                await tk.call("write", {"path": "d00/f00000.bin", "content": payload.hex()})
                clock = Clock()
                await tk.snapshot()
                snaps.append(clock.read())
                await tk.call("write", {"path": "d00/f00000.bin", "content": "changed again"})
                clock = Clock()
                await tk.restore(first)
                restores.append(clock.read())
            snaps.sort()
            restores.sort()
            row["snapshot after 1 change"] = ms(snaps[len(snaps) // 2])
            row["restore after 1 change"] = ms(restores[len(restores) // 2])
            if args.snapshot_only:
                continue
            before = store_bytes(store)
            kids = [k for k in await tk.fork(args.children) if isinstance(k, Toolkit)]
            for kid in kids:
                await kid.call("write", {"path": "mine.txt", "content": os.urandom(1 << 19).hex()})
                await kid.snapshot()
                await kid.close()
            grown = store_bytes(store) - before
            row[f"store growth, {args.children} children x 1 MiB"] = f"{grown / (1 << 20):.1f} MiB"
        shutil.rmtree(ws, ignore_errors=True)
    if args.snapshot_only:
        return row
    floors = [await fresh_opens(name, scratch, args.children) for _ in range(args.repeat)]
    row[f"{args.children} fresh sessions (floor)"] = f"{statistics.median(floors):.2f} s"
    return row


async def run(args: argparse.Namespace) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="branch-bench-"))
    scratch.chmod(0o711)
    store = scratch / "store"
    os.environ["TOOLSEAM_SNAPSHOTS"] = str(store)
    rows: dict[str, dict[str, str]] = {}
    try:
        for name in filter(None, args.backends.split(",")):
            began = time.perf_counter()
            rows[name] = await measure(name, args, scratch, store)
            print(f"{name}: done in {time.perf_counter() - began:.0f} s", flush=True)
        if args.ray:
            began = time.perf_counter()
            rows["ray (3 nodes)"] = await measure_ray(args.files, args.mib, args.ray_children)
            print(f"ray: done in {time.perf_counter() - began:.0f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    names = list(rows)
    print(f"\n{args.files} files / {args.mib} MiB, fork({args.children}), median of "
          f"{args.repeat}\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    keys = list(dict.fromkeys(k for row in rows.values() for k in row))
    for key in keys:
        print(f"| {key} | " + " | ".join(rows[n].get(key, "—") for n in names) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--small-mib", type=int, default=20)
    parser.add_argument("--small-all", action="store_true")
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--outside-mib", type=int, default=100)
    parser.add_argument("--layer-only", action="store_true")
    parser.add_argument("--snapshot-only", action="store_true")
    parser.add_argument("--ray", action="store_true")
    parser.add_argument("--ray-children", type=int, default=12)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
