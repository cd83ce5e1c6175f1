"""How to launch the agent from a directory: a staged copy of ``toolseam_agent`` beside a
two-line ``__main__.py``, run as ``python -I -S DIR`` — Python puts a directory it runs on
``sys.path`` itself, so the agent has one import name everywhere and nothing patches a path.

The host backend runs a staged copy too (its ``python`` may be another interpreter than this
one); a container's bundle lays the same directory out beside its runtime
(``containers/bundle/staged.py``).
"""

from __future__ import annotations

import compileall
import hashlib
import shutil
import tempfile
from pathlib import Path

import toolseam_agent

from .. import staging

AGENT_SOURCE = Path(toolseam_agent.__file__).resolve().parent  # the package's own directory
AGENT_PACKAGE = "toolseam_agent"  # its one import name, here and in every sandbox
# A staged directory's entry point: ``python DIR`` puts DIR on sys.path itself and runs this.
MAIN_SCRIPT = b"from toolseam_agent.main import main\n\nmain()\n"


# An argument the agent ignores: what ``ps`` shows it as, and how tests find agent processes.
MARK = "--toolseam-agent"


def agent_command(directory: str) -> list[str]:
    """The interpreter arguments that run the staged agent in ``directory`` (which holds
    ``__main__.py`` and ``toolseam_agent/``): isolated, without ``site``, and writing no
    bytecode — a staged directory is sealed (``staging.verified``); its bytecode is staged."""
    return ["-I", "-S", "-B", directory, MARK]


def _agent_sources() -> list[Path]:
    return sorted(AGENT_SOURCE.glob("*.py"))


def stage_agent() -> str:
    """A world-readable copy of the agent package and its ``__main__.py`` (a rootless engine
    cannot read a 0700 home), in this user's staging root (``staging.py``), verified before
    reuse."""
    sources = _agent_sources()
    digest = hashlib.sha256(MAIN_SCRIPT + b"".join(
        p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:16]
    root = staging.staging_root()
    staged = root / f"agent-{digest}"
    if staging.verified(staged) and all(
            (staged / AGENT_PACKAGE / p.name).read_bytes() == p.read_bytes() for p in sources):
        return str(staged)
    work = Path(tempfile.mkdtemp(prefix=".agent-stage-", dir=root))
    try:
        (work / AGENT_PACKAGE).mkdir()
        for source in sources:
            shutil.copyfile(source, work / AGENT_PACKAGE / source.name)
        (work / "__main__.py").write_bytes(MAIN_SCRIPT)
        # this interpreter's bytecode: the host agent starts without compiling its sources
        compileall.compile_dir(str(work / AGENT_PACKAGE), quiet=1)
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        staging.write_manifest(work)
        staging.install(work, staged)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return str(staged)
