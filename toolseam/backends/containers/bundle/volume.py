"""The agent's bundle in an engine volume, for copy mode (nothing of the host's is mounted
there): filled once per engine and bundle, its digest in the volume's name."""

from __future__ import annotations

import fcntl
import hashlib
import os

from ...staging import staging_root
from ..engine.protocol import ContainerSpec, Engine, Hardening
from ..labels import AGENT_MOUNT, AGENT_VOLUME_LABEL
from .staged import bundle_archive, bundle_digest


def agent_volume_for(engine: Engine, bundle: str, image: str, hardening: Hardening,
                     session_id: str) -> str:
    """The volume holding ``bundle`` on ``engine`` (blocking: run it in the engine's thread).
    A second, empty volume marks the fill complete: a fill cut short is redone."""
    name = f"toolseam-agent-{bundle_digest(bundle)}"
    ready = f"{name}-ready"
    if engine.volume_exists(ready):
        return name
    labels = {AGENT_VOLUME_LABEL: name}
    # Sessions of every process on this host that meet the same empty engine fill it one at a
    # time (the first fills, the others find it ready); an fcntl lock, since they are separate
    # processes. Hosts sharing an engine may still fill it twice: the same bytes, and nobody
    # uses the volume before "-ready" exists.
    key = hashlib.sha256((engine.endpoint + name).encode()).hexdigest()[:16]
    # The lock lives in this user's staging root: a predictable name in the shared temp dir
    # could be made first by another local user (and held, or made a symlink).
    with open(os.path.join(staging_root(), f"fill-{key}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if engine.volume_exists(ready):
            return name
        if not engine.volume_exists(name):
            engine.create_volume(name, labels)
        helper = engine.create(ContainerSpec(
            image=image, name=f"toolseam-fill-{session_id}",
            command=["/opt/toolseam/never-started"], labels=labels, environment={},
            binds=[], hardening=hardening, volumes=[(name, AGENT_MOUNT, False)]))
        try:
            with bundle_archive(bundle) as archive:
                engine.put_archive(helper, AGENT_MOUNT, archive)
        finally:
            engine.remove(helper)
        engine.create_volume(ready, labels)
    return name
