"""Trees changed and described INSIDE a sandbox, for branching tests on every backend: the
changes are made by a command there (as an agent's would be, in copy mode the host never sees
them), and the description is read back the same way. Names are bytes (hex on the wire):
names that are not UTF-8 are part of the property."""

from __future__ import annotations

import json

from hypothesis import strategies as st

from toolseam import Toolkit

from .trees import Tree

NAMES = [b"a", b"b", b"c\xff", b"d e"]
PATHS = st.lists(st.sampled_from(NAMES), min_size=1, max_size=2).map(b"/".join)
OPS = st.one_of(
    st.tuples(st.just("write"), PATHS, st.binary(max_size=64)),
    st.tuples(st.just("same-size"), PATHS, st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("delete"), PATHS),
    st.tuples(st.just("rename"), PATHS, PATHS),
    st.tuples(st.just("chmod"), PATHS, st.sampled_from([0o600, 0o644, 0o755, 0o500, 0o1777])),
    st.tuples(st.just("symlink"), PATHS, st.sampled_from([b"a", b"../x", b"/etc", b"b/c\xff"])),
    st.tuples(st.just("mkdir"), PATHS),
)
Op = tuple[object, ...]

# Applies a JSON list of [kind, hex path, hex|int argument] to the working directory; an op
# that cannot happen (a missing parent...) changes nothing. The same semantics as the host
# property test's _apply (tests/host/test_snapshot_property.py).
_APPLY = r'''
import json, os, shutil, sys
for kind, path, arg in json.loads(sys.argv[1]):
    path = bytes.fromhex(path)
    try:
        if kind == "write":
            with open(path, "wb") as out:
                out.write(bytes.fromhex(arg))
        elif kind == "same-size" and os.path.isfile(path) and not os.path.islink(path):
            before = os.stat(path)
            data = bytes.fromhex(arg) * (before.st_size // max(1, len(arg) // 2) + 1)
            with open(path, "r+b") as out:
                out.write(data[:before.st_size])
            os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        elif kind == "delete":
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        elif kind == "rename":
            os.rename(path, bytes.fromhex(arg))
        elif kind == "chmod" and not os.path.islink(path):
            os.chmod(path, arg)
        elif kind == "symlink":
            os.symlink(bytes.fromhex(arg), path)
        elif kind == "mkdir":
            os.mkdir(path)
    except OSError:
        pass
'''

_DESCRIBE = r'''
import json, os, stat
found = {}
for folder, dirs, files in os.walk(b"."):
    for name in dirs + files:
        path = os.path.join(folder, name)
        rel = os.path.relpath(path, b".")
        st = os.lstat(path)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            found[rel.hex()] = ["link", 0, os.readlink(path).hex()]
        elif stat.S_ISDIR(st.st_mode):
            found[rel.hex()] = ["dir", mode, ""]
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as source:
                found[rel.hex()] = ["file", mode, source.read().hex()]
        else:
            found[rel.hex()] = ["other", mode, ""]
print(json.dumps(found))
'''

# Empties the workspace from inside (directories made enterable first: a 0500 one's entries)
EMPTY = ("find . -mindepth 1 -type d -exec chmod u+rwx {} ';' ; "
         "find . -mindepth 1 -maxdepth 1 -exec rm -rf {} +")


def _wire(op: Op) -> list[object]:
    kind, path = str(op[0]), bytes(op[1])  # type: ignore[call-overload]
    arg = op[2] if len(op) > 2 else ""
    return [kind, path.hex(), arg.hex() if isinstance(arg, bytes) else arg]


async def run(tk: Toolkit, command: str) -> str:
    result = await tk.call("bash", {"command": command})
    assert result.metadata.get("exitCode") == 0, result.output
    return result.output


def _apply_command(ops: list[Op], where: str) -> str:
    ops_json = json.dumps([_wire(op) for op in ops])
    return f"(cd {where} && python3 - '{ops_json}' <<'TOOLSEAM_EOF'\n{_APPLY}\nTOOLSEAM_EOF\n)"


async def apply_ops(tk: Toolkit, ops: list[Op]) -> None:
    """The ops, made by a command in the sandbox's workspace."""
    if ops:
        await run(tk, _apply_command(ops, "."))


async def apply_ops_in(tk: Toolkit, ops: dict[str, list[Op]]) -> None:
    """Each directory's ops (``{directory: ops}``), made by one command in the sandbox."""
    steps = [_apply_command(chosen, where) for where, chosen in ops.items() if chosen]
    if steps:
        await run(tk, " && ".join(steps))


def _tree(found: dict[str, list[object]]) -> Tree:
    return {bytes.fromhex(name): (str(kind), int(str(mode)), bytes.fromhex(str(data)))
            for name, (kind, mode, data) in found.items()}


async def describe_inside(tk: Toolkit) -> Tree:
    """``trees.describe`` of the workspace as the sandbox sees it."""
    return (await describe_inside_all(tk, ["."]))[0]


async def describe_inside_all(tk: Toolkit, places: list[str]) -> list[Tree]:
    """``trees.describe`` of each directory as the sandbox sees it, read by one command."""
    out = await run(tk, " && ".join(
        f"(cd {where} && python3 - <<'TOOLSEAM_EOF'\n{_DESCRIBE}\nTOOLSEAM_EOF\n)"
        for where in places))
    return [_tree(json.loads(line)) for line in out.splitlines()]
