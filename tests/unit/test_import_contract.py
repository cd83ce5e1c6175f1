"""The import contract (issue 34): layers top to bottom, no upward import, the agent alone,
private modules and private names kept to their own package.

The layers live in ``.importlinter`` (``lint-imports`` reads it); docs/architecture.md draws
them. A private *name* taken from another package (``from ..x import _helper``) is checked
here with ``ast``: import-linter checks modules only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

from toolseam.backends import BACKEND_NAMES as _TABLE_NAMES

REPO = Path(__file__).resolve().parents[2]


def test_lint_imports_keeps_every_contract() -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout


def _package(module: str) -> str:
    """A module's package one level below the top (``toolseam.backends``); the top-level
    modules (``toolseam.session.toolkit``) and ``toolseam_agent`` are each one package."""
    parts = module.split(".")
    if parts[0] == "toolseam" and len(parts) > 1 and (REPO / "toolseam" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0]


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def private_names_taken_across_packages() -> list[str]:
    found = []
    for path in sorted([*(REPO / "toolseam").rglob("*.py"), *(REPO / "toolseam_agent").rglob("*.py")]):
        module = _module_name(path)
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(module, node, path.name == "__init__.py")
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and _package(source) != _package(module):
                    found.append(f"{module}: from {source} import {alias.name}")
    return found


def test_no_private_name_is_taken_across_packages() -> None:
    assert private_names_taken_across_packages() == []


def test_the_check_sees_a_private_name_taken_across_packages(tmp_path: Path) -> None:
    node = ast.parse("from ..policy.settings import _hidden").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _resolve("toolseam.backends.host", node, False) == "toolseam.policy.settings"
    assert _package("toolseam.policy.settings") != _package("toolseam.backends.host")


# Outside the backends a backend is asked for facts (``toolseam.backends.backend_kind``, the
# seam's capabilities), never told apart by its name (issues 34, 47): every name of the table,
# its variants' included, read from the table itself.
BACKEND_NAMES = set(_TABLE_NAMES)
# a string equal to a backend name that is not one, each with its reason
NOT_A_BACKEND_NAME = {
    ("toolseam/egress/rules.py", "host"): "the HTTP Host header, which a rule may not set",
    ("toolseam/ray/node_observe.py", "host"): "the error codec's kind of a HostError",
}


def backend_names_tested(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                for value in values:
                    if isinstance(value, ast.Constant) and value.value in BACKEND_NAMES:
                        found.append(f"{where}:{node.lineno} tests the backend name {value.value!r}")
    return found


def test_no_backend_name_is_compared_outside_the_backends() -> None:
    found = []
    for path in sorted((REPO / "toolseam").rglob("*.py")):
        where = str(path.relative_to(REPO))
        if where.startswith("toolseam/backends/"):
            continue
        found += [line for line in backend_names_tested(path.read_text(), where)
                  if (where, line.rsplit(" ", 1)[1].strip("'")) not in NOT_A_BACKEND_NAME]
    assert found == []


def test_the_name_check_sees_a_name_tested() -> None:
    assert backend_names_tested('if toolkit.backend.name == "host":\n    pass\n', "x.py") == [
        "x.py:1 tests the backend name 'host'"]
    assert backend_names_tested('if name in ("docker", "x"):\n    pass\n', "x.py") == [
        "x.py:1 tests the backend name 'docker'"]
    assert backend_names_tested('if name in ("bind", "copy"):\n    pass\n', "x.py") == []


def test_backend_kinds_answer_for_every_name_an_open_backend_reports() -> None:
    from toolseam.backends import BACKENDS, backend_kind
    from toolseam.seam.errors import BackendUnavailable

    assert [backend_kind(name).contained for name in BACKENDS] == [False, True, True, True]
    assert backend_kind("podman-rootless").name == "podman"
    assert backend_kind("ray").class_name == "RayBackend"
    with pytest.raises(BackendUnavailable,
                       match="unknown backend 'lxc'; choose one of host, podman, docker, ray"):
        backend_kind("lxc")


# An import inside a function is kept for an optional extra alone — its SDK is imported when
# the feature is used, so a user without the extra imports toolseam — never to dodge a circle
# (issue 47: such circles are broken by moving code). Each one, with what it waits for:
OPTIONAL_EXTRA = "the {} extra, imported only when it is used"
LAZY_IMPORTS = {
    ("toolseam.frontends.cli", "toolseam.frontends.mcp.server"): OPTIONAL_EXTRA.format("mcp"),
    ("toolseam.frontends.cli", "toolseam.frontends.mcp.http"): OPTIONAL_EXTRA.format("mcp"),
    ("toolseam.frontends.cli", "toolseam.frontends.mcp.listen"): "the mcp extra's --http branch",
    ("toolseam.frontends.inspect._cleanup", "toolseam.backends.podman"):
        OPTIONAL_EXTRA.format("podman"),
    ("toolseam.frontends.inspect._cleanup", "toolseam.backends.docker"):
        OPTIONAL_EXTRA.format("docker"),
    ("toolseam.frontends.mcp.server", "toolseam.egress.session"): OPTIONAL_EXTRA.format("egress"),
    ("toolseam.frontends.stdio", "toolseam.egress.session"): OPTIONAL_EXTRA.format("egress"),
    ("toolseam.session.toolkit", "toolseam.egress.session"): OPTIONAL_EXTRA.format("egress"),
    ("toolseam.policy.settings", "toolseam.egress.rules"): OPTIONAL_EXTRA.format("egress"),
    ("toolseam.frontends.metrics_server", "toolseam.observability.prometheus"):
        OPTIONAL_EXTRA.format("otel"),
    ("toolseam.observability", "toolseam.observability.telemetry"): OPTIONAL_EXTRA.format("otel"),
    ("toolseam.observability.config", "toolseam.observability.telemetry"):
        OPTIONAL_EXTRA.format("otel"),
    ("toolseam.observability.across", "toolseam.observability.telemetry"):
        OPTIONAL_EXTRA.format("otel"),
    ("toolseam.frontends.ps", "toolseam.ray"): OPTIONAL_EXTRA.format("ray"),
    ("toolseam.session.lazy_sandbox_pool", "toolseam.session.sandbox_pool"):
        OPTIONAL_EXTRA.format("podman or docker"),
}


def imports_inside_functions(source: str, module: str, is_package: bool) -> set[tuple[str, str]]:
    """(module, the toolseam module it imports) for each import made inside a function."""
    found = set()
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.ImportFrom):
                imported = [_resolve(module, node, is_package)]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            found |= {(module, name) for name in imported if name.split(".")[0] == "toolseam"}
    return found


def test_no_import_inside_a_function_but_an_optional_extras() -> None:
    found: set[tuple[str, str]] = set()
    for path in sorted((REPO / "toolseam").rglob("*.py")):
        found |= imports_inside_functions(path.read_text(), _module_name(path),
                                          path.name == "__init__.py")
    assert sorted(found - set(LAZY_IMPORTS)) == [], (
        "imports inside functions: move them to the top of the module (a circle is broken by "
        "moving code, not by hiding an import); an optional extra's goes in LAZY_IMPORTS")
    assert sorted(set(LAZY_IMPORTS) - found) == [], "LAZY_IMPORTS names imports that are gone"


def test_the_lazy_import_check_sees_one() -> None:
    source = "import os\ndef f():\n    from .node import NodeSession\n    import toolseam.x\n"
    assert imports_inside_functions(source, "toolseam.ray.pool", False) == {
        ("toolseam.ray.pool", "toolseam.ray.node"), ("toolseam.ray.pool", "toolseam.x")}


# No circle among toolseam's modules (issue 47): every import counts — one under
# ``if TYPE_CHECKING:`` (a type is a dependency too, decision 483) and one inside a function
# (LAZY_IMPORTS above) alike. A circle is broken by moving code: a protocol the lower module
# declares (``session/toolkit_view.py``), a callable passed in, a module split by what it is about.
TOLERATED_CIRCLES: dict[frozenset[str], str] = {}  # none (the Ray wing's went: decision 470)


def strongly_connected(nodes: Iterable[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return sorted(found)


def module_circles(package: str) -> list[list[str]]:
    """Every circle among ``package``'s modules, each as its sorted modules."""
    graph = grimp.build_graph(package, cache_dir=None)  # TYPE_CHECKING imports included
    return strongly_connected(graph.modules, {module: graph.find_modules_directly_imported_by(module)
                                              for module in graph.modules})


def test_no_circle_among_toolseams_modules() -> None:
    found = module_circles("toolseam")
    assert [c for c in found if frozenset(c) not in TOLERATED_CIRCLES] == [], (
        "import circles: break each by moving code (a protocol the lower module declares, a "
        "callable passed in, a module split by what it is about), never by hiding an import")
    assert [sorted(c) for c in TOLERATED_CIRCLES if sorted(c) not in found] == [], (
        "TOLERATED_CIRCLES names a circle that is gone: remove its entry")


def test_the_circle_check_sees_one_through_a_type_and_a_function(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "circled_47"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from .b import B\n")
    (package / "b.py").write_text("class B:\n    def f(self):\n        from . import a\n")
    (package / "c.py").write_text("from . import a\n")  # imports the circle, is not in it
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_circles("circled_47") == [["circled_47.a", "circled_47.b"]]
    assert strongly_connected("xyz", {"x": {"y"}, "y": {"z"}, "z": {"x"}}) == [["x", "y", "z"]]
    assert strongly_connected("xyz", {"x": {"y"}, "y": {"z"}}) == []
