"""The durable sessions behind ``ToolseamWorkspace`` refs: one live client per environment in
this process, and the attach secrets kept out of the refs.

A ref is a ``WorkspaceRef`` — pydantic-ai keeps it in message history, which goes to logs and
UIs — so it must hold no credential. Its id is the session handle's JSON without the secret;
the secret is kept in a private file of this user's (a 0700 directory, a 0600 file) named
after the session, and found there again at attach. Only this user on this machine can attach,
which is what toolseam's attach needs anyway (the agent's socket is here).

One client per environment: the agent refuses a second attach while a client is attached
(``in_use``), so a second backend built from the same ref in this process shares the live
client instead — the same toolkit on the same loop thread — and lets go of nothing when it is
done; ``destroy`` ends the sandbox for all of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..seam.handle import SessionHandle
from ..session.toolkit import Toolkit
from ._session import LoopThread, Workspace

PROVIDER = "toolseam"


@dataclass
class LiveSession:
    """A toolkit open in this process, on its loop thread."""

    runner: LoopThread
    toolkit: Toolkit
    workspace: Workspace = field(default_factory=lambda: Workspace(None))
    destroyed: bool = False


_live: dict[str, LiveSession] = {}
_live_lock = threading.Lock()


def find(ref_id: str) -> LiveSession | None:
    with _live_lock:
        return _live.get(ref_id)


def register(ref_id: str, session: LiveSession) -> LiveSession:
    """Record ``session`` as the live client of ``ref_id``; the one already there wins."""
    with _live_lock:
        return _live.setdefault(ref_id, session)


def forget(ref_id: str) -> None:
    with _live_lock:
        _live.pop(ref_id, None)


def ref_id(handle: SessionHandle) -> str:
    """The handle's JSON without its secret, keys sorted: the ref's id."""
    data = json.loads(handle.to_json())
    data.pop("secret", None)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


def handle_from(ref_id_text: str, store: Path) -> tuple[SessionHandle, str | None] | None:
    """The handle ``ref_id`` names, with the secret kept for it, and the workspace directory
    the environment's creator made (to remove at destroy); None when nothing is kept."""
    try:
        data = json.loads(ref_id_text)
        kept = json.loads(_secret_file(store, ref_id_text).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(kept, dict):
        return None
    try:
        handle = SessionHandle.from_json(json.dumps({**data, "secret": kept.get("secret")}))
    except ValueError:
        return None
    made = kept.get("made_workspace")
    return handle, made if isinstance(made, str) else None


def keep_secret(store: Path, handle: SessionHandle, made_workspace: str | None) -> None:
    """Write the handle's secret (and the workspace directory made for it) to its private
    file: created 0600 in a 0700 directory, never readable by another user."""
    store.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(store, 0o700)  # a directory that existed with wider rights is narrowed
    path = _secret_file(store, ref_id(handle))
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as out:
        json.dump({"secret": handle.secret, "made_workspace": made_workspace}, out)


def drop_secret(store: Path, ref_id_text: str) -> None:
    _secret_file(store, ref_id_text).unlink(missing_ok=True)


def default_store() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                             "state")
    return Path(state) / "toolseam" / "workspaces"


def _secret_file(store: Path, ref_id_text: str) -> Path:
    return store / (hashlib.sha256(ref_id_text.encode()).hexdigest()[:32] + ".json")
