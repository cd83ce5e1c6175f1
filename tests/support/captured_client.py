"""Run INSIDE egress sandboxes (python3, stdlib only): clients that ignore the proxy variables
and dial names directly, as a Go binary or a database client does. One JSON line out.

    python3 captured_client.py tcp '{"host": ..., "port": ..., "send": "..."}'
    python3 captured_client.py https '{"host": ..., "port": ..., "path": ..., "headers": {...}}'
    python3 captured_client.py scan '{"needle_hex": "..."}'   # environ, files, memory of processes
"""

import json
import os
import socket
import ssl
import sys


def tcp(host, port, send, timeout=10):
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(send.encode())
            sock.shutdown(socket.SHUT_WR)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        return {"ok": True, "got": data.decode("latin-1")}
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def https(host, port, path, headers, timeout=10):
    """A GET over TLS straight to host:port, trusting SSL_CERT_FILE (OpenSSL's own variable)."""
    context = ssl.create_default_context()
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw, \
                context.wrap_socket(raw, server_hostname=host) as sock:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        return {"status": int(head.split()[1]), "body": body.decode("latin-1")}
    except (OSError, ssl.SSLError, ValueError, IndexError) as exc:
        return {"status": None, "error": f"{type(exc).__name__}: {exc}"}


def scan(needle_hex, roots=None):
    """Where ``needle`` shows up: each process's environ, cmdline and readable memory, and
    every file under ``roots`` (default: / but /proc, /sys and /dev) this user can read."""
    # given as hex, so no command line holds it; this process (which decodes it) is skipped
    want = bytes.fromhex(needle_hex)
    found, memory_read = [], 0
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        for part in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{part}", "rb") as f:
                    if want in f.read():
                        found.append(f"/proc/{pid}/{part}")
            except OSError:
                pass
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
                for line in maps:
                    span, perms = line.split()[:2]
                    if not perms.startswith("r"):
                        continue
                    start, end = (int(x, 16) for x in span.split("-"))
                    if end - start > 1 << 28:
                        continue
                    try:
                        mem.seek(start)
                        if want in mem.read(end - start):
                            found.append(f"/proc/{pid}/mem")
                        memory_read += 1
                    except (OSError, OverflowError, ValueError):
                        pass
        except OSError:
            pass
    tops = roots or ["/" + top for top in os.listdir("/") if top not in ("proc", "sys", "dev")]
    for top in tops:
        for root, _dirs, files in os.walk(top):
            for name in files:
                path = os.path.join(root, name)
                try:
                    if os.path.isfile(path) and os.path.getsize(path) < 64 << 20:
                        with open(path, "rb") as f:
                            if want in f.read():
                                found.append(path)
                except OSError:
                    pass
    return {"found": sorted(set(found)), "regions_read": memory_read}


if __name__ == "__main__":
    command, args = sys.argv[1], json.loads(sys.argv[2])
    print(json.dumps({"tcp": tcp, "https": https, "scan": scan}[command](**args)))
