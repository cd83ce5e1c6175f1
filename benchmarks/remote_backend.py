"""The remote backend's cost per call (issue 47): the host backend here next to the same
backend hosted by a remote server in another process, through the unix socket — a bash call
and a small read through a Toolkit, and a bare seam ``stat``, each a p50 in alternating blocks
(``bench.interleaved``).

    python benchmarks/remote_backend.py
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import interleaved, row

from toolseam import Toolkit
from toolseam.backends.host import HostBackend
from toolseam.backends.remote import HostedSpec, RemoteBackend, UnixTransport
from toolseam.seam.models import PathRef

CALLS = 400


async def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="toolseam-bench-remote-"))
    workspace, directory = work / "ws", work / "server"
    workspace.mkdir()
    (workspace / "small.txt").write_text("x" * 120)
    server = subprocess.Popen([sys.executable, "-m", "toolseam.backends.remote.serve",
                               str(directory)])
    try:
        while not (directory / "socket").exists():
            time.sleep(0.02)
        local = Toolkit(HostBackend(str(workspace)), base_dir=str(workspace))
        remote = Toolkit(RemoteBackend(transport=UnixTransport(directory),
                                       hosted=HostedSpec(kind="host",
                                                         options={"workspace": str(workspace)})),
                         base_dir=str(workspace))
        async with local, remote:
            ref = PathRef(base=str(workspace), path="small.txt")
            rows = [row("call (p50 ms)", "host", "remote (unix socket)", "difference")]
            for name, make in (
                    ("bash `true`", lambda tk: lambda: tk.call("bash", {"command": "true"})),
                    ("read (120 B)", lambda tk: lambda: tk.call("read",
                                                                {"file_path": "small.txt"})),
                    ("seam stat", lambda tk: lambda: tk.backend.stat(ref))):
                found = await interleaved({"host": make(local), "remote": make(remote)}, CALLS)
                rows.append(row(name, f"{found['host']:.3f}", f"{found['remote']:.3f}",
                                f"+{(found['remote'] - found['host']) * 1e3:.0f} µs"))
        print("\n".join(rows))
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    asyncio.run(main())
