"""A fork's base (decisions 507, 513, 516): the snapshot's tree restored ONCE per fork into a
directory no sandbox writes, which each child's workspace is an overlay over — a container's
``/workspace`` mounted by its engine (``containers/fork_overlay.py``), a root host's private
workspace mounted by this process (``host_overlay.py``). So a child costs a few directories and
a mount, whatever the workspace holds.

On the host (``ForkBase.root``)::

    fork-PID-STARTMS-TOKEN/        the store's branches dir (0700, this user's); for a rootless
                                   engine run by root: the temp dir, 0711 and root's (that
                                   user passes it, cannot list or rename it)
        base/                      the snapshot's tree (the safe restore, apply.py), 0700
        c-NAME/upper, c-NAME/work  one child's overlay dirs, 0700 around them

Every file and directory below is given to the uid a container's root maps to where that is
not this process's (decision 403's rule), so the sandbox's root may change its files: the
kernel copies a lower file up into the child's upper dir on its first write, and the base is
never written. The kernel, not this process, writes the upper dir; this process only removes
it, descriptor-relative and never through a link (``apply.remove_tree_at``).

The session that forked keeps the base once its last child closed, and its next fork brings
it up to date by what changed (decision 513); otherwise, and at that session's close, the base
goes when the last child that uses it closed (``release``, ``let_go``); a process that died
leaves its fork dirs to the janitor (``sweep_fork_dirs``: the owner's pid and start time are
in the name), which has removed that process's containers and volumes, or detached its
overlays, first.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar, cast

import psutil

from ..mount_calls import mount_table, unmount
from ..owner import still_runs
from .apply import remove_tree_at
from .capture import Known
from .local import LocalSnapshots, branches_root
from .manifest import Manifest

FORK_PREFIX = "fork-"  # in the store's branches dir
OTHER_USERS_PREFIX = "toolseam-fork-"  # in the temp dir: a rootless engine's user reaches it
# what a path may hold to be written into the overlay's mount options unquoted: "," and ":"
# separate options and lower dirs there, and the engines have no escape for them
_PLAIN_PATH = re.compile(r"[A-Za-z0-9_./+-]+")
_NAME = re.compile(r"(\d+)-(\d+)-[0-9a-f]+")


Image = TypeVar("Image", bound="StartImage")


class StartImage(Protocol):
    """An image a fork's children start from (``containers/fork_image.py``), kept with the
    base: made in a thread (``start``), removed with the base."""

    def start(self) -> StartImage: ...

    def remove(self) -> None: ...


class ForkBase:
    """One fork's shared, read-only base and its children's overlay dirs."""

    def __init__(self, root: str, owner: int | None, userxattr: bool = False) -> None:
        self.root, self.owner = root, owner
        # a rootless engine mounts in its user namespace, where the overlay cannot keep its
        # state in trusted.* attributes (removing a lower directory failed with EIO): it keeps
        # it in user.overlay.*, which the kernel escapes when a command sets such a name
        self.userxattr = userxattr
        self.base = os.path.join(root, "base")
        self.users = 0  # children that hold it (ForkBases.acquire / release)
        self.restores = 0  # how many times the base was filled: once a fork (the tests count)
        # the session that forked keeps it for its next fork (decision 513), which brings it
        # up to date by what changed instead of restoring every file again
        self.kept = False
        self.gone = False
        self._tree = LocalSnapshots()  # what its last restore left (stat keys), for the next
        # The restore runs in a thread of its own while the children's containers are made:
        # an overlay is mounted only when its container starts (``ChildOverlay.wait``).
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        # the fork's start image on each engine its children are on (fork_image.py), made by
        # the first child's backend and removed with the base
        self.images: dict[tuple[str, str, str], StartImage] = {}
        self._images_lock = threading.Lock()

    def image_for(self, key: tuple[str, str, str], make: Callable[[], Image]) -> Image:
        """The start image ``key`` — (engine endpoint, session's image, the layer's key,
        ``containers/fork_image.py``): made (in a thread) by the first asking, or kept from
        the session's previous fork when its layer outside /tmp has not changed since."""
        with self._images_lock:
            found = self.images.get(key)
            if found is None:
                found = self.images[key] = make().start()
            return cast(Image, found)  # the one maker of a key is one kind's backend

    def refill(self, manifest: Manifest, layer: str | None) -> None:
        """A kept base (no child holds it) made another snapshot's, in a thread: only what
        differs is written. The images of another layer than ``layer`` go: no container uses
        them."""
        self.ready.clear()
        self.failure = None
        threading.Thread(target=self.fill, args=(manifest.id, layer),
                         daemon=True, name="toolseam-fork-base").start()

    def fill(self, snapshot_id: str, layer: str | None = None) -> None:
        dropped: list[StartImage] = []
        if layer is not None:
            with self._images_lock:
                stale = [key for key in self.images if key[2] != layer]
                dropped = [self.images.pop(key) for key in stale]
        try:
            self._tree._restore(self.base, snapshot_id, self.owner)
            self.restores += 1
        except BaseException as exc:  # noqa: BLE001 - each child's start raises it
            self.failure = exc
        finally:
            self.ready.set()
            for image in dropped:
                image.remove()

    def known(self) -> Known:
        """What its last restore knew of the base's files (stat keys and digests), a copy."""
        found = self._tree._known(self.base)
        return Known(dict(found.files), found.source)

    def child_dirs(self, root_mode: int = 0o755) -> tuple[str, str, str]:
        """A new child's (its dir, upper, work), made empty; the upper's mode is what the
        child's workspace root shows (0755 for a container's, as a fresh volume's)."""
        name = "c-" + secrets.token_hex(6)
        child = os.path.join(self.root, name)
        os.mkdir(child, 0o700)
        upper, work = os.path.join(child, "upper"), os.path.join(child, "work")
        os.mkdir(upper, root_mode)
        os.chmod(upper, root_mode)  # whatever the umask took
        os.mkdir(work, 0o700)
        if self.owner is not None:
            for path in (child, upper, work):
                os.chown(path, self.owner, self.owner, follow_symlinks=False)
        return name, upper, work

    def remove_child(self, name: str) -> None:
        """A child's dirs, after its container and volume are gone (the mount with them)."""
        _remove_below(self.root, name)


class ForkBases:
    """The bases of this process's forks under way, by snapshot and owner: the children of one
    fork share one, made by the first and removed by the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bases: dict[tuple[str, int | None, bool], ForkBase] = {}

    def acquire(self, holder: BaseHolder | None, manifest: Manifest, owner: int | None,
                rootless: bool, layer: str | None = None) -> ForkBase:
        """The base of the snapshot ``manifest`` for sandboxes whose root is ``owner`` (None: this
        process's uid) on a rootless engine or not, for a fork of ``holder`` — its restore
        started now (in a thread) if no child of it is open: into the base ``holder`` kept
        from its previous fork when no child holds that one (only what differs is written),
        else into a new one; one more user of it. ``holder`` keeps it for its next fork
        (None: a session that will not close, such as the remote server's template: the base
        goes with its last child). ``layer``: the key of the snapshot's layer outside /tmp
        (``containers/fork_image.py``): a kept base's images of another are removed."""
        snapshot_id = manifest.id
        key = (snapshot_id, owner, rootless)
        let_go: ForkBase | None = None
        with self._lock:  # the fork's children share the one restore
            found = self._bases.get(key)
            if found is None:
                spare = None if holder is None else holder.fork_base
                if spare is not None and spare.users == 0 and not spare.gone \
                        and (spare.owner, spare.userxattr) == (owner, rootless):
                    found = spare
                    found.refill(manifest, layer)
                else:
                    found = _new_base(snapshot_id, owner, rootless)
                self._bases[key] = found
            found.users += 1
            if holder is not None and holder.fork_base is not found:
                let_go, holder.fork_base = holder.fork_base, found
                found.kept = True
                if let_go is not None:
                    let_go = self._unkeep(let_go)
        if let_go is not None:
            _discard(let_go)
        return found

    def release(self, base: ForkBase) -> None:
        """One user fewer; the last one's release removes the base and its dir, unless the
        session that forked keeps it for its next fork."""
        with self._lock:
            base.users -= 1
            if base.users > 0:
                return
            for key, found in list(self._bases.items()):
                if found is base:
                    del self._bases[key]
            if base.kept and base.ready.is_set() and base.failure is None:
                return
            base.gone = True  # a base whose restore failed is not kept either
        _discard(base)

    def let_go(self, holder: BaseHolder) -> None:
        """``holder`` closes: the base it kept goes now, or with its last child."""
        with self._lock:
            base, holder.fork_base = holder.fork_base, None
            base = self._unkeep(base) if base is not None else None
        if base is not None:
            _discard(base)

    def _unkeep(self, base: ForkBase) -> ForkBase | None:
        """(Under the lock) ``base`` no longer kept: itself when nothing holds it (the
        caller discards it), else None (its last child's release will)."""
        base.kept = False
        if base.users > 0 or base.gone:
            return None
        base.gone = True
        return base


class BaseHolder(Protocol):
    """A session that forks: the base it keeps for its next fork."""

    fork_base: ForkBase | None


def _discard(base: ForkBase) -> None:
    """A base no child holds and no session keeps: its dir, then its images."""
    base.ready.wait()  # a restore still writing there ends first
    try:
        remove_fork_root(base.root)
    finally:
        for image in base.images.values():  # no child's container uses them now
            image.remove()


FORK_BASES = ForkBases()


def overlay_paths_plain(*paths: str) -> bool:
    """Whether the paths can be written into mount options (no ``,`` or ``:``)."""
    return all(_PLAIN_PATH.fullmatch(p) for p in paths)


def fork_parent(owner: int | None) -> str:
    """Where a fork's dir is made for ``owner`` (see the module's docstring)."""
    return str(branches_root()) if owner is None else tempfile.gettempdir()


def _new_base(snapshot_id: str, owner: int | None, rootless: bool) -> ForkBase:
    me = psutil.Process()
    tag = f"{os.getpid()}-{int(me.create_time() * 1000)}-{secrets.token_hex(6)}"
    if owner is None:
        root = os.path.join(fork_parent(None), FORK_PREFIX + tag)
        os.mkdir(root, 0o700)
    else:
        root = os.path.join(fork_parent(owner), OTHER_USERS_PREFIX + tag)
        os.mkdir(root, 0o700)
        os.chmod(root, 0o711)  # the engine's user passes, cannot list; root's, so not renamed
    made = ForkBase(root, owner, userxattr=rootless)
    try:
        os.mkdir(made.base, 0o700)
        if owner is not None:
            os.chown(made.base, owner, owner)
        threading.Thread(target=made.fill, args=(snapshot_id,), daemon=True,
                         name="toolseam-fork-base").start()
    except BaseException:
        remove_fork_root(root)
        raise
    return made


def remove_fork_root(root: str) -> None:
    """Remove a fork's dir (``root`` must be one: by its parent and prefix), never through a
    link: what a child's command made in its upper dir is removed as names, not followed."""
    path = Path(root)
    if not _is_fork_dir(path):
        raise ValueError(f"{root} is not a fork's dir")
    _remove_below(str(path.parent), path.name)


def _is_fork_dir(path: Path) -> bool:
    return ((str(path.parent) == str(branches_root()) and path.name.startswith(FORK_PREFIX))
            or (str(path.parent) == tempfile.gettempdir()
                and path.name.startswith(OTHER_USERS_PREFIX)))


def _remove_below(parent: str, name: str) -> None:
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        remove_tree_at(parent_fd, name)
    finally:
        os.close(parent_fd)


def sweep_fork_dirs() -> list[str]:
    """The janitor's part: remove the fork dirs whose process is gone (it died before its
    children closed), after detaching a root host's overlays over them (``host_overlay.py``).
    A dir of a live process, or one this user did not make, stays."""
    removed = detach_dead_overlays()
    for parent, prefix in ((fork_parent(None), FORK_PREFIX),
                           (tempfile.gettempdir(), OTHER_USERS_PREFIX)):
        try:
            names = [n for n in os.listdir(parent) if n.startswith(prefix)]
        except OSError:
            continue
        for name in names:
            if not dead_fork_dir(name, prefix):
                continue
            path = os.path.join(parent, name)
            with contextlib.suppress(OSError):
                seen = os.lstat(path)
                if not stat.S_ISDIR(seen.st_mode) or seen.st_uid != os.geteuid():
                    continue  # a link, or another user's: never ours to remove
                _remove_below(parent, name)
                removed.append(path)
    return removed


def dead_fork_dir(name: str, prefix: str = FORK_PREFIX) -> bool:
    """Whether the fork dir ``name`` (one of this machine's) is a process's that is gone: its
    pid and start time are in the name. A name that is not a fork dir's is not."""
    found = _NAME.fullmatch(name[len(prefix):]) if name.startswith(prefix) else None
    if found is None:
        return False
    pid, started_ms = found.groups()
    return not still_runs(int(pid), int(started_ms) / 1000)


def detach_dead_overlays() -> list[str]:
    """Detach the overlays mounted in the store's branches dir whose fork's process is gone
    (it died before its children closed; a root host's children, ``host_overlay.py``); their
    mount points, for the janitor's report."""
    root = str(branches_root())
    detached: list[str] = []
    try:
        table = mount_table()
    except OSError:
        return detached
    for point, fstype, options in table:
        if fstype != "overlay":
            continue
        lower = next((o.removeprefix("lowerdir=") for o in options.split(",")
                      if o.startswith("lowerdir=")), "")
        fork_dir = Path(lower).parent
        # dead_fork_dir: a name with the fork dirs' prefix, pid and start time, and gone
        if os.path.dirname(point) != root or fork_dir.parent != Path(root) \
                or not dead_fork_dir(fork_dir.name):
            continue
        try:
            unmount(point)
        except OSError:
            continue
        detached.append(point)
        with contextlib.suppress(OSError):
            os.rmdir(point)  # the empty mount point: the branch workspace it was
    return detached
