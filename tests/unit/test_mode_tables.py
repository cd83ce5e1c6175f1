"""The container wing's variants are tables, chosen once: a workspace mode is a row of
``backend.MODES``, a lifetime a row of ``backend.LIFETIMES`` (the backend's ``lifetime``
option, ``seam/lifetime.py``), and every mode composes with every lifetime in the one place
that pairs them — no subclass per pair, no module that knows both but ``backend.py``. A
backend's lifetime is chosen when it is built and never switched after; a session's lifetime
follows the settings or the backend it is given (docs/architecture.md, "Adding a workspace
mode or a lifetime"; decisions 453 to 455)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

import toolseam
from toolseam.backends.containers.backend import LIFETIMES, MODES
from toolseam.backends.containers.options import ContainerOptions, Pooled
from toolseam.backends.containers.pool.mounts import HOST_SLOTS
from toolseam.backends.host import HostBackend
from toolseam.backends.host_durable import DurableHostAgent
from toolseam.backends.podman import PodmanBackend
from toolseam.policy.settings import Settings
from toolseam.seam.capabilities import lifetime_of
from toolseam.seam.errors import ConfigurationError
from toolseam.seam.lifetime import EPHEMERAL, Durable, Ephemeral
from toolseam.session.durable import Durable as DurableSession
from toolseam.session.lifetime import Ephemeral as EphemeralSession
from toolseam.session.lifetime import lifetime_for
from toolseam.session.toolkit import Toolkit

PACKAGE = Path(toolseam.__file__).parent
CONTAINERS = PACKAGE / "backends" / "containers"
LIFETIME_OPTIONS = (Ephemeral(), Durable(orphan_timeout_s=60))


@pytest.mark.parametrize(("mode", "option"), list(itertools.product(MODES, LIFETIME_OPTIONS)))
def test_every_mode_composes_with_every_lifetime(mode: str, option: Ephemeral | Durable,
                                                 tmp_path: Path) -> None:
    backend = PodmanBackend(str(tmp_path), workspace_mode=mode,  # type: ignore[arg-type]
                            endpoint="unix:///nonexistent/podman.sock", lifetime=option)
    assert backend.sandbox.mode.name == mode
    assert type(backend.sandbox.lifetime) is LIFETIMES[type(option)]
    assert backend.lifetime is option and lifetime_of(backend) is option
    assert backend.sandbox.lifetime.outlives_client == isinstance(option, Durable)


def _imports(path: Path) -> set[str]:
    """The toolseam modules ``path`` imports, as dotted names relative to the package."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            name = ".".join(p for p in (base, node.module or "") if p)
            found.add(name)
            found.update(f"{name}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_backend_is_the_only_module_pairing_a_mode_with_a_lifetime() -> None:
    modes, lifetimes = "toolseam.backends.containers.modes.", \
        "toolseam.backends.containers.lifetimes."
    pairing = []
    for path in PACKAGE.rglob("*.py"):
        names = _imports(path)
        knows_mode = any(n.startswith(modes) and n != modes + "workspace_access" for n in names)
        knows_lifetime = any(n.startswith(lifetimes) for n in names)
        if knows_mode and knows_lifetime:
            pairing.append(path.relative_to(PACKAGE).as_posix())
        inside = path.relative_to(CONTAINERS).parts[0] if path.is_relative_to(CONTAINERS) \
            else ""
        assert not (inside == "modes" and knows_lifetime), f"{path} names a lifetime"
        assert not (inside == "lifetimes" and knows_mode), f"{path} names a mode"
    assert pairing == ["backends/containers/backend.py"]


def test_no_class_is_a_mode_for_one_lifetime() -> None:
    """A subclass of a mode per lifetime (the old ``DurableBindMode``) is what the tables
    replaced: no class anywhere derives from a mode."""
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base) for base in node.bases}
                assert not bases & {"BindMode", "CopyMode"}, f"{path}: {node.name}"
    assert not list((CONTAINERS / "modes").glob("durable*.py"))


def test_the_host_runs_the_agent_its_lifetime_says(tmp_path: Path) -> None:
    assert not isinstance(HostBackend(str(tmp_path)).agent, DurableHostAgent)
    durable = HostBackend(str(tmp_path), lifetime=Durable(orphan_timeout_s=5))
    assert isinstance(durable.agent, DurableHostAgent)
    with pytest.raises(ConfigurationError, match="host backend: lifetime must be"):
        HostBackend(str(tmp_path), lifetime="durable")  # type: ignore[arg-type]


def test_a_backends_lifetime_cannot_be_switched_after_it_is_built(tmp_path: Path) -> None:
    for built in (HostBackend(str(tmp_path)),
                  PodmanBackend(str(tmp_path), workspace_mode="copy",
                                endpoint="unix:///nonexistent/podman.sock")):
        assert not hasattr(built, "make_durable")
        with pytest.raises(AttributeError):
            built.lifetime = Durable(orphan_timeout_s=30)  # type: ignore[misc]
        with pytest.raises(ConfigurationError, match="built to end with its client.*never "
                           r"switched after: build it with lifetime=Durable\(orphan_timeout_s"
                           "=30"):
            Toolkit(built, settings={"orphan_timeout_s": 30})
        assert lifetime_of(built) is EPHEMERAL
    durable = HostBackend(str(tmp_path), lifetime=Durable(orphan_timeout_s=30))
    with pytest.raises(ConfigurationError, match="the settings say 60, but the backend was "
                       r"built with lifetime=Durable\(orphan_timeout_s=30\)"):
        Toolkit(durable, settings={"orphan_timeout_s": 60})


def test_a_session_follows_the_lifetime_its_backend_was_built_with(tmp_path: Path) -> None:
    option = Durable(orphan_timeout_s=30)
    tools = Toolkit(HostBackend(str(tmp_path), lifetime=option))
    assert tools.settings.orphan_timeout_s == 30  # what front ends read
    assert isinstance(tools._lifetime, DurableSession) and tools._lifetime.secret == option.secret
    by_name = Toolkit("host", base_dir=str(tmp_path), settings={"orphan_timeout_s": 30})
    built = lifetime_of(by_name.backend)
    assert isinstance(built, Durable) and built.orphan_timeout_s == 30
    assert isinstance(by_name._lifetime, DurableSession)
    assert built.secret == by_name._lifetime.secret  # the one secret, made once


def test_bad_lifetimes_are_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"Durable\(orphan_timeout_s=0\): how long"):
        Durable(orphan_timeout_s=0)
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Durable(orphan_timeout_s=5, secret="short")
    with pytest.raises(ConfigurationError, match="lifetime must be"):
        ContainerOptions(lifetime="durable")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="a pool's sandbox is started as an ordinary"):
        ContainerOptions(provisioning=Pooled("p", HOST_SLOTS),
                         lifetime=Durable(orphan_timeout_s=5))
    secret = Durable(orphan_timeout_s=5).secret
    assert secret not in repr(Durable(orphan_timeout_s=5, secret=secret))


def test_the_lifetime_is_chosen_once_from_the_settings() -> None:
    assert isinstance(lifetime_for(Settings()), EphemeralSession)
    durable = lifetime_for(Settings(orphan_timeout_s=30))
    assert isinstance(durable, DurableSession) and durable.orphan_timeout_s == 30
    assert not durable.adopted and len(durable.secret) >= 43
    assert lifetime_for(Settings(orphan_timeout_s=30)).secret != durable.secret  # type: ignore[attr-defined]
