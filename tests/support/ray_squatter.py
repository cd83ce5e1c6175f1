"""For the crashed-driver egress test (tests/backends/test_ray_egress.py): a driver that opens an
egress session and is then killed, and another local user who binds the port it freed.

``DRIVER`` (run with ``python -c``; argv: address, node resource JSON, upstream port, the
fetch script) opens a
``RayBackend`` in egress mode, writes the sandbox's proxy variables to ``proxy.sh`` in its
workspace, and prints its handle, its egress port and token as one JSON line.
``SQUATTER`` (argv: port, record file) listens on 127.0.0.1:port, writes every byte it is sent
to the record file and answers each connection as an allowed host would — with a mark.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import tempfile

SQUATTER_USER = "toolseam-squatter"
MARK = b"PWNED-BY-LOCAL-USER"

DRIVER = r"""
import asyncio, json, sys
from toolseam import Toolkit
from toolseam.policy.limits import SandboxLimits
from toolseam.ray import RayBackend

async def main():
    address, node, upstream = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    backend = RayBackend(resources=node, address=address, limits=SandboxLimits(network="egress"))
    settings = {"limits": {"network": "egress"}, "egress_allow": [f"web.test:{upstream}"],
                "egress_resolve": {"web.test": "127.0.0.1"}, "egress_private": True}
    tk = Toolkit(backend, settings=settings)
    await tk.open()
    await tk.call("write", {"path": "fetch.py", "content": sys.argv[4]})
    await tk.call("bash", {"command": "env | grep -i _proxy | sed 's/^/export /' > proxy.sh"})
    print(json.dumps([backend.handle, backend._egress_at[1], backend._egress.token]), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""

SQUATTER = r"""
import socket, sys
port, record = int(sys.argv[1]), sys.argv[2]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(16)
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.settimeout(5)
    try:
        data = conn.recv(65536)
        with open(record, "ab") as out:
            out.write(data)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\nPWNED-BY-LOCAL-USER")
        with open(record, "ab") as out:
            out.write(conn.recv(65536))
    except OSError:
        pass
    finally:
        conn.close()
"""


def squatter_user() -> pwd.struct_passwd:
    """An unprivileged account of this machine's, made once (no home, no login shell)."""
    try:
        return pwd.getpwnam(SQUATTER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", SQUATTER_USER], check=True)
        return pwd.getpwnam(SQUATTER_USER)


def as_user(user: pwd.struct_passwd, argv: list[str]) -> list[str]:
    """``argv`` run as ``user``, with no supplementary groups and no capabilities."""
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--inh-caps=-all", *argv]


def record_dir(user: pwd.struct_passwd) -> str:
    """A new directory only the squatter may write its record into (the test's own temporary
    directories are 0700 root's); the caller removes it."""
    path = tempfile.mkdtemp(prefix="toolseam-squatter-")
    os.chown(path, user.pw_uid, user.pw_gid)
    return path
