"""Every Python and shell example in README.md and docs/ runs as written, one case per block,
so an example that breaks fails the suite (issue 33).

Python blocks run in a fresh interpreter (this one, with the checkout first on the path) in an
empty directory holding a README.md; a block may ``await`` at top level, as in ``python -m
asyncio``. Shell blocks run under ``bash -e`` with ``toolseam`` on the PATH and stdin an empty
pipe. A block that names an engine runs in a directory its user can reach (rootless podman)
and is marked ``engines`` by tests/conftest.py. How the markdown marks a block that cannot run
here, a fragment, or a server: tests/support/doc_examples.py. The ``python`` blocks of
docs/integrations/ run in tests/host/test_docs_integrations.py, which also checks what they print.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..support.doc_examples import ROOT, DirectiveError, DocExample, all_examples, page_examples
from ..support.engines import remove_shared, required_env, shared_dir

EXAMPLES = all_examples()
RUN_ELSEWHERE = [e for e in EXAMPLES if e.tag == "python" and e.where.startswith("docs/integrations/")]
HERE = [e for e in EXAMPLES if e not in RUN_ELSEWHERE]
MOST_SKIPPED = 18  # keep it small: a skipped example is one that can break unseen (6: docs/ray.md,
# three of them run by their own ray-marked tests: test_ray_recipe.py, test_ray_shaped.py; the
# remote backend over Ray's steps are test_ray_remote.py's; docs/sessions.md's durable remote
# session, whose steps test_remote_durable.py's killed-client case takes over a server process)

# a Python block may await at top level (the fragments inside "async with" of the docs)
RUNNER = """import ast, asyncio, sys
path = sys.argv[1]
sys.argv = sys.argv[1:]  # as "python example.py" sees it
code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
pending = eval(code, {"__name__": "__main__", "__file__": path})
if pending is not None:
    asyncio.run(pending)
"""
ENGINE_VARIABLES = {"podman": ("TOOLSEAM_PODMAN_URL", "TOOLSEAM_PODMAN_ROOTLESS_URL"),
                    "docker": ("TOOLSEAM_DOCKER_URL",)}
SERVER_STARTS_S = 6.0


@pytest.fixture
def example_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    example: DocExample = request.node.callspec.params["example"]
    path = shared_dir() if example.engine else tmp_path  # pytest's tmp dirs are 0700 root
    (path / "README.md").write_text("hello from the docs example\n")
    yield path
    if example.engine:
        remove_shared(path)


def _environment(example: DocExample, bin_dir: Path) -> dict[str, str]:
    """This environment, the engine variables required, ``toolseam`` on the PATH and a ``pip``
    that checks an install line instead of changing the suite's venv."""
    for variable in ENGINE_VARIABLES.get(example.engine or "", ()):
        required_env(variable, f"{example.where} names {example.engine}")
    bin_dir.mkdir()
    # this checkout's toolseam (the venv's entry script may belong to another checkout)
    for name, module in (("toolseam", "toolseam"), ("pip", "tests.support.pip_check")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        (bin_dir / name).chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    return {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path}


@pytest.mark.parametrize("example", HERE, ids=[e.where for e in HERE])
def test_the_example_runs_as_written(example: DocExample, example_dir: Path, tmp_path: Path) -> None:
    if example.skip:
        pytest.skip(f"{example.where}: {example.skip}")
    env = _environment(example, tmp_path / "bin")
    if example.language == "python":
        (example_dir / "example.py").write_text(example.code)
        command = [sys.executable, "-c", RUNNER, "example.py"]
    else:
        (example_dir / "example.sh").write_text(example.code)
        command = ["bash", "-e", "-o", "pipefail", "example.sh"]
    if example.server:
        _serves_until_stopped(example, command, example_dir, env)
        return
    done = subprocess.run(command, cwd=example_dir, env=env, input="", capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, f"{example.where} failed:\n{done.stdout}\n{done.stderr}"


def _serves_until_stopped(example: DocExample, command: list[str], cwd: Path,
                          env: dict[str, str]) -> None:
    server = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        out, err = server.communicate(input="", timeout=SERVER_STARTS_S)
        pytest.fail(f"{example.where}: ended ({server.returncode}) instead of serving:\n{out}\n{err}")
    except subprocess.TimeoutExpired:
        pass  # still serving: what the page promises
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.communicate()


# every pty_read returns one byte: each prompt arrives split across reads, deterministically
ONE_BYTE_READS = """from toolseam.session.raw import RawSandbox
whole_read = RawSandbox.pty_read
async def one_byte_read(self, pty, *, yield_ms=1000, max_bytes=1 << 20):
    return await whole_read(self, pty, yield_ms=yield_ms, max_bytes=1)
RawSandbox.pty_read = one_byte_read
"""


def test_the_terminal_example_waits_for_a_prompt_split_across_reads(tmp_path: Path) -> None:
    """Issue 45: the interactive-process example of docs/raw-sandbox.md looked for ``>>> `` in
    the latest read only, so a prompt split across two reads (``42\\r\\n>``, ``>> ``) was never
    seen and it polled empty reads forever (3 of 44 fresh runs hung). Here every read is one
    byte — the real host backend's output, only cut up — and the example must still finish."""
    example = next(e for e in page_examples(ROOT / "docs" / "raw-sandbox.md")
                   if "pty_start" in e.code)
    (tmp_path / "example.py").write_text(example.code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-c", ONE_BYTE_READS + RUNNER, "example.py"],
                              cwd=tmp_path, env=env, input="", capture_output=True, text=True,
                              timeout=90)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"{example.where} still waits after 90 s on one-byte reads: {hung.stdout!r}")
    assert done.returncode == 0, f"{example.where} failed:\n{done.stdout}\n{done.stderr}"
    assert "42 seen" in done.stdout


def test_skipped_examples_say_why_and_are_few() -> None:
    skipped = [e for e in EXAMPLES if e.skip]
    print(f"\n{len(skipped)} of {len(EXAMPLES)} examples are not run here:")
    for example in skipped:
        print(f"  {example.where}: {example.skip}")
    assert all(len(e.skip or "") > 10 for e in skipped)
    assert len(skipped) <= MOST_SKIPPED


def test_the_docs_have_examples_of_each_kind() -> None:
    assert {e.language for e in HERE if not e.skip} == {"python", "shell"}
    assert any(e.engine for e in HERE if not e.skip)
    assert len(RUN_ELSEWHERE) == 9  # one per integration page, two on pydantic-ai.md and openai-agents.md


def test_a_block_that_names_an_engine_is_marked_engines(request: pytest.FixtureRequest) -> None:
    cases = {item: example for item in request.session.items
             if isinstance(item, pytest.Function) and hasattr(item, "callspec")
             and isinstance(example := item.callspec.params.get("example"), DocExample)}
    assert {e.where for item, e in cases.items() if item.get_closest_marker("engines")} == {
        e.where for e in cases.values() if e.engine}


INSTALL_EXTRAS = r"\[([a-z0-9,-]+)\]"


def test_every_extra_an_install_line_names_exists() -> None:
    import re

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
                 ["optional-dependencies"])
    named = {extra for e in EXAMPLES if e.language == "shell"
             for line in e.code.splitlines() if "pip install" in line
             for group in re.findall(INSTALL_EXTRAS, line) for extra in group.split(",")}
    assert named and named <= extras, named - extras


# --- how the markdown says what a block is -----------------------------------------------------
def test_directives_skip_continue_and_serve(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example: skip (reaches pypi.org) -->\n```sh\ncurl https://pypi.org\n```\n"
                    "```python\nx = 1\n```\ntext\n<!-- example: continues -->\n```py\nprint(x)\n```\n"
                    "<!-- example: server -->\n```bash\ntoolseam mcp --http 127.0.0.1:0\n```\n"
                    "```console\n$ toolseam --version\ntoolseam 0.1.0\n```\n```text\nnot code\n```\n")
    skip, first, fragment, server, console = page_examples(page)
    assert skip.skip == "reaches pypi.org" and skip.language == "shell"
    assert first.code == "x = 1\n" and fragment.code == "x = 1\nprint(x)\n" and fragment.continues
    assert server.server and server.engine is None and console.code == "toolseam --version\n"


def test_an_engine_named_only_in_a_comment_needs_none(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('```python\n# Toolkit("podman") for a container\nToolkit("host")\n```\n'
                    '```sh\ntoolseam call bash "{}" --backend docker  # here\n```\n')
    host, docker = page_examples(page)
    assert host.engine is None and docker.engine == "docker"


@pytest.mark.parametrize("comment", ["skip", "skip ()", "continue", "run later"])
def test_an_unknown_or_reasonless_directive_is_refused(tmp_path: Path, comment: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"<!-- example: {comment} -->\n```sh\ntrue\n```\n")
    with pytest.raises(DirectiveError, match=r"page\.md:2"):
        page_examples(page)


def test_continues_needs_a_block_before(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example: continues -->\n```sh\ntrue\n```\n")
    with pytest.raises(DirectiveError, match="no shell block comes before"):
        page_examples(page)


@pytest.mark.parametrize(("line", "problem"), [
    ("install -e '/path/to/checkout[mcp,integrations]'", None),
    ("install -e /path/to/toolseam langchain-core", None),
    ("install 'dist/toolseam-0.1.0-py3-none-any.whl[podman,mcp]'", None),
    ("install -e '/path/to/checkout[mcp,inspekt]'", "toolseam has no extra 'inspekt'"),
    ("install no-such-package-for-toolseam", "no-such-package-for-toolseam"),
    ("uninstall -y pydantic", "only 'pip install' is checked"),
])
def test_pip_in_an_example_checks_and_installs_nothing(line: str, problem: str | None) -> None:
    import shlex

    done = subprocess.run([sys.executable, "-m", "tests.support.pip_check", *shlex.split(line)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert (done.returncode == 0) == (problem is None), done.stderr
    assert problem is None or problem in done.stderr
