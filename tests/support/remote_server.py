"""A remote server (``python -m toolseam.backends.remote.serve``) in a process of its own that
the test starts and ends, and the backend that reaches it through the real unix socket."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from toolseam.backends.remote import HostedSpec, RemoteBackend, UnixTransport

from .timing import patience


@dataclass
class ServerProcess:
    directory: Path
    process: subprocess.Popen[bytes]

    def backend(self, workspace: Path | str, kind: str = "host", **options: object
                ) -> RemoteBackend:
        """A client session hosting a ``kind`` backend (the host's by default) in
        ``workspace`` on this server."""
        return RemoteBackend(transport=UnixTransport(self.directory),
                             hosted=HostedSpec(kind=kind,
                                               options={"workspace": str(workspace), **options}))


@contextmanager
def remote_server(snapshots: Path | None = None) -> Iterator[ServerProcess]:
    """The server, once its socket is there (it appears only when listening); SIGTERM and a
    wait at the end (SIGKILL if it does not go), so no server outlives its test.
    ``snapshots``: the server's own snapshot store (``TOOLSEAM_SNAPSHOTS``), apart from the
    test's."""
    directory = Path(tempfile.mkdtemp(prefix="toolseam-remote-")) / "server"
    env = dict(os.environ)
    if snapshots is not None:
        env["TOOLSEAM_SNAPSHOTS"] = str(snapshots)
    process = subprocess.Popen([sys.executable, "-m", "toolseam.backends.remote.serve",
                                str(directory)], stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + patience(30)
        while not (directory / "socket").exists():
            assert process.poll() is None, process.stderr.read() if process.stderr else b""
            assert time.monotonic() < deadline, "the remote server did not listen"
            time.sleep(0.02)
        yield ServerProcess(directory, process)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(patience(10))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()
