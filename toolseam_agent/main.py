"""The agent's entry point: how it was started (a container's pid 1 on stdio, the host's agent in
its own namespaces, a durable agent on its socket, or a relay into one) decides what runs.
Kept apart from ``server.py`` so the durable agent (``session_socket.py``), which builds on
``server.Agent``, is imported from here and not from the module it extends."""

from __future__ import annotations

import os
import socket
import sys


def _daemonize() -> None:
    """Detach from the host process so it is not an ancestor of any command (its environ would
    be readable through /proc/<ancestor>/environ). Used only when no pid namespace is had."""
    if os.fork() > 0:
        os._exit(0)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # Each role imports only its own modules: a snapshot or restore runs the pack and apply
    # roles once or twice as the sandbox's root, and importing the agent's server, relay and
    # durable socket as well made each run's start two to three times as long.
    if "--layer-pack" in args:  # the layer or the workspace, packed by the sandbox's root
        from . import pack
        raise SystemExit(pack.pack_all(args[args.index("--layer-pack") + 1:]))
    if "--layer-apply" in args:
        from . import layer
        raise SystemExit(layer.apply(args[args.index("--layer-apply") + 1]))
    _serve(args)


def _serve(args: list[str]) -> None:
    from . import userns
    from .relay import relay
    from .server import STARTUP, Agent
    from .session_socket import Listener, serve

    if "--daemonize" in args:
        _daemonize()
    durable = args[args.index("--durable") + 1] if "--durable" in args else None
    listener = None
    if durable is not None:  # bound first: it must be where clients look, outside any mount
        listener = Listener(durable)
    if "--own-user-namespace" in args:  # the host backend's agent, pid 1 of its pid namespace
        try:
            # --own-network (egress mode): commands get only loopback and no /run; the host
            # checks what hello reports and refuses the session unless both hold
            if "--own-network" in args:
                try:
                    userns.hide_run()
                    STARTUP.run_hidden = True
                except OSError as exc:
                    print(f"the agent cannot hide /run: {exc}", file=sys.stderr)
                if STARTUP.run_hidden:  # captured connections need names resolved by the agent
                    try:
                        userns.own_resolver()
                    except OSError as exc:
                        print(f"the agent cannot mount its resolv.conf: {exc}", file=sys.stderr)
            if listener is not None:  # commands never see the socket a client attaches to
                try:
                    STARTUP.control_hidden = listener.hide_from_commands()
                except OSError as exc:
                    print(f"the agent cannot hide its session directory: {exc}",
                          file=sys.stderr)
            userns.enter_own_user_namespace(network="--own-network" in args)
            STARTUP.proc_locked = True
        except OSError as exc:  # still better than no pid namespace at all: go on, and say so
            print(f"the agent cannot lock its /proc in a user namespace: {exc}", file=sys.stderr)
            STARTUP.proc_locked = False
    if "--relay" in args:  # an exec's stream into a durable agent's socket (relay.py)
        raise SystemExit(relay(args[args.index("--relay") + 1]))
    if listener is not None:  # a session that outlives its client (session_socket.py)
        serve(listener, os.environ)
    elif "--listen" in args:
        path = args[args.index("--listen") + 1]
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(path):
            os.unlink(path)
        server.bind(path)
        os.chmod(path, 0o600)
        server.listen(1)
        conn, _ = server.accept()
        server.close()
        Agent(conn.fileno(), conn.fileno()).run()
        conn.close()
    else:
        Agent(sys.stdin.fileno(), sys.stdout.fileno()).run()


if __name__ == "__main__":
    main()
