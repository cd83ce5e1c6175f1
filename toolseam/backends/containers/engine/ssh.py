"""``ssh://`` engine endpoints: the engine's unix socket on the other machine, forwarded to a
private local socket by the system's ``ssh`` client (``-L local.sock:remote.sock``).

Both the SDK and the attach channel then speak to that local socket, so one tunnel carries
the whole session, and ``ssh`` brings the user's own configuration: keys, agents, jump hosts,
known hosts (``~/.ssh/config``) — as ``docker -H ssh://…`` and ``podman --url ssh://…`` do.
The sandbox is in copy mode (the engine is elsewhere), whatever the local socket suggests.

Hand-written rather than the SDKs' own ssh support: docker's shells out per connection
(``docker system dial-stdio`` on the remote side, which the attach stream would need too) and
podman-py's forwards a socket much like this but keeps it private to its client.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from urllib.parse import urlsplit

from ....seam.errors import ConfigurationError, CouldNotRunError

_UP_TIMEOUT_S = 20.0


class SshTunnel:
    """One ``ssh -N -L`` process for one engine; ``local_socket`` is where to connect."""

    def __init__(self, endpoint: str, default_remote_socket: str) -> None:
        parts = urlsplit(endpoint)
        if parts.scheme != "ssh" or not parts.hostname:
            raise ConfigurationError(f"not an ssh endpoint: {endpoint!r}")
        self.endpoint = endpoint
        self.destination = f"{parts.username}@{parts.hostname}" if parts.username else parts.hostname
        self.port = parts.port
        self.remote_socket = parts.path if parts.path not in ("", "/") else default_remote_socket
        self._dir = tempfile.mkdtemp(prefix="toolseam-ssh-")
        os.chmod(self._dir, 0o700)
        self.local_socket = os.path.join(self._dir, "engine.sock")
        self._process: subprocess.Popen[bytes] | None = None

    def up(self) -> str:
        """Start the forward if it is not running; the local socket's path."""
        if self._process is not None and self._process.poll() is None:
            return self.local_socket
        ssh = shutil.which("ssh")
        if ssh is None:
            raise CouldNotRunError(f"{self.endpoint}: no ssh client on this machine "
                                   "(install openssh-client)", retryable=False)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.local_socket)
        argv = [ssh, "-N", "-T", "-o", "ExitOnForwardFailure=yes", "-o", "BatchMode=yes",
                "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
                "-L", f"{self.local_socket}:{self.remote_socket}"]
        if self.port:
            argv += ["-p", str(self.port)]
        argv += ["--", self.destination]
        self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + _UP_TIMEOUT_S
        while not os.path.exists(self.local_socket):
            if self._process.poll() is not None or time.monotonic() > deadline:
                reason = self._stop_and_read()
                raise CouldNotRunError(f"ssh tunnel to {self.endpoint} failed: "
                                       f"{reason or 'timed out'}", retryable=True)
            time.sleep(0.02)
        return self.local_socket

    def _stop_and_read(self) -> str:
        process, self._process = self._process, None
        if process is None:
            return ""
        if process.poll() is None:
            process.kill()
        _, err = process.communicate(timeout=5)
        return err.decode("utf-8", "replace").strip().splitlines()[-1] if err.strip() else ""

    def close(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._process.stderr is not None:
                self._process.stderr.close()
            self._process = None
        shutil.rmtree(self._dir, ignore_errors=True)
