"""What a newcomer meets in the first hour (issue 23): a typo'd base dir, a settings mapping, a
second ``asyncio.run``, a missing extra, ``| head``, ``call --help``, the demo's output, the
constructor's docstrings. Real processes throughout; the CLI runs as a subprocess."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from toolseam import ConfigurationError, CouldNotRunError, HostError, SyncToolkit, Toolkit
from toolseam.backends.host import HostBackend
from toolseam.frontends.cli_terms import in_cli_terms
from toolseam.integrations.pydantic_ai import ToolseamWorkspace

from ..support import engines
from ..support.processes import host_survivors

TOOLSEAM = [sys.executable, "-m", "toolseam.frontends.cli"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOLSEAM, *args], capture_output=True, text=True, timeout=60)


# --- a base dir that is not there -----------------------------------------------------------
@pytest.mark.parametrize("kind", ["missing", "file"])
async def test_open_refuses_a_base_dir_that_is_not_a_directory(tmp_path: Path, kind: str) -> None:
    base = tmp_path / "typo"
    if kind == "file":
        base.write_text("not a dir")
    backend = HostBackend(str(base))
    toolkit = Toolkit(backend, base_dir=str(base))
    with pytest.raises(ConfigurationError) as caught:
        await toolkit.open()
    problem = "does not exist" if kind == "missing" else "is not a directory"
    assert str(caught.value) == f"base_dir {base} {problem} on this host"
    assert isinstance(caught.value, HostError)
    assert backend.agent.channel is None  # the agent started for the check is gone again
    pid = backend.agent.launcher_pid
    assert pid is None or not Path(f"/proc/{pid}").exists()


async def test_a_call_on_a_missing_base_dir_raises_rather_than_blaming_the_model(
        tmp_path: Path) -> None:
    toolkit = Toolkit("host", base_dir=str(tmp_path / "nope"))
    with pytest.raises(ConfigurationError, match="nope does not exist"):
        await toolkit.call("glob", {"pattern": "*"})
    await toolkit.close()


def test_cli_refuses_a_missing_base_dir_in_one_line(tmp_path: Path) -> None:
    done = cli("call", "glob", '{"pattern": "*"}', "--base-dir", str(tmp_path / "nope"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"toolseam: base_dir {tmp_path / 'nope'} does not exist on this host\n"


# --- settings as a mapping ------------------------------------------------------------------
async def test_settings_may_be_a_mapping(tmp_path: Path) -> None:
    toolkit = Toolkit("host", base_dir=str(tmp_path),
                      settings={"timeout_policy": "detach", "timeout_range_ms": [1000, 900_000]})
    assert toolkit.settings.timeout_policy == "detach"
    assert toolkit.settings.timeout_range_ms == (1000, 900_000)
    async with toolkit:
        assert (await toolkit.call("bash", {"command": "echo hi"})).output == "hi\n"
    with pytest.raises(ConfigurationError, match="unknown field 'max_job'"):
        Toolkit("host", settings={"max_job": 2})
    with pytest.raises(ConfigurationError, match="a Settings or a mapping"):
        Toolkit("host", settings=["max_jobs", 2])  # type: ignore[arg-type]
    with SyncToolkit("host", base_dir=str(tmp_path), settings={"max_jobs": 5}) as tools:
        assert tools.toolkit.settings.max_jobs == 5


# --- a second event loop --------------------------------------------------------------------
def test_a_toolkit_used_from_a_second_loop_says_what_to_do(tmp_path: Path) -> None:
    # In a subprocess: the first loop's transports are abandoned with it, as in a user's script.
    marker = f"sleep {4_000_000 + os.getpid() % 100_000}"
    code = textwrap.dedent(f"""
        import asyncio
        from toolseam import HostError, Toolkit
        toolkit = Toolkit("host", base_dir={str(tmp_path)!r})
        print(asyncio.run(toolkit.call("bash", {{"command": "{marker} & echo one"}})).output, end="")
        for again in (lambda: toolkit.call("read", {{"path": "x"}}), toolkit.close, toolkit.end_turn):
            try:
                asyncio.run(again())
            except HostError as exc:
                print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, *errors = done.stdout.splitlines()
    assert first == "one" and len(errors) == 3
    for message in errors:
        assert message.startswith("this Toolkit was opened in another event loop (that loop has ended)")
        assert "asyncio.run" in message and "SyncToolkit" in message
    assert "different loop" not in done.stderr
    assert host_survivors(marker) == []  # the agent took its jobs with it when the program ended


async def test_the_same_loop_keeps_working(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path)) as toolkit:
        for word in ("a", "b"):
            assert (await toolkit.call("bash", {"command": f"echo {word}"})).output == f"{word}\n"
        await toolkit.end_turn()


# --- every constructor parameter documented -------------------------------------------------
def test_every_constructor_parameter_is_documented() -> None:
    """Toolkit documents each of its parameters; SyncToolkit takes the same options
    (``ToolkitOptions``, tests/unit/test_toolkit_options.py) and sends its reader there."""
    doc = inspect.getdoc(Toolkit) or ""
    params = [p for p in inspect.signature(Toolkit.__init__).parameters if p != "self"]
    assert len(params) >= 14
    missing = [p for p in params if not re.search(rf"^\s+{p}: \S", doc, re.M)]
    assert missing == [], f"Toolkit docstring lacks {missing}"
    sync_doc = " ".join((inspect.getdoc(SyncToolkit) or "").split())
    assert "ToolkitOptions" in sync_doc and "see ``Toolkit`` for what each does" in sync_doc


# --- a missing extra names what to install --------------------------------------------------
@pytest.mark.parametrize(("name", "sdk"), [("Podman", "podman"), ("Docker", "docker")])
def test_a_backend_class_without_its_extra_names_the_install_line(name: str, sdk: str) -> None:
    code = textwrap.dedent(f"""
        import sys
        sys.modules[{sdk!r}] = None  # as if the extra were not installed
        from toolseam import BackendUnavailable, Toolkit
        try:
            from toolseam.backends import {name}Backend
        except BackendUnavailable as exc:
            print(exc)
        try:
            Toolkit({sdk!r})
        except BackendUnavailable as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    assert lines[0].startswith(f"the {sdk} backend needs the '{sdk}' package: pip install '{sdk}>=")
    assert f"toolseam[{sdk}]" in lines[0] and "pip install 'toolseam[" not in lines[0]


def test_the_backend_classes_import_lazily() -> None:
    from toolseam.backends import HostBackend as lazy

    assert lazy is HostBackend
    with pytest.raises(AttributeError):
        import toolseam.backends

        _ = toolseam.backends.NoSuchBackend  # type: ignore[attr-defined]


# --- the command line in a pipe, and its help -----------------------------------------------
@pytest.mark.parametrize("args", [
    ("call", "bash", '{"command": "seq 300000"}'),
    ("tools", "--format", "anthropic"),
    ("demo",),
])
def test_a_closed_pipe_ends_quietly(tmp_path: Path, args: tuple[str, ...]) -> None:
    if args[0] == "call":
        args = (*args, "--base-dir", str(tmp_path))
    with subprocess.Popen([*TOOLSEAM, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert len(proc.stdout.read(10)) == 10  # like `| head -c 10`
        proc.stdout.close()
        stderr = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    assert stderr == ""
    # `tools` may fit in the pipe's buffer before the reader goes; the others cannot
    assert code == 141 or (args[0] == "tools" and code == 0)


def test_call_help_names_the_tools_their_arguments_and_the_exit_codes() -> None:
    done = cli("call", "--help")
    assert done.returncode == 0
    text = done.stdout
    declared = json.loads(cli("tools", "--format", "openai").stdout)
    for declaration in declared:
        function = declaration["function"]
        (row,) = [line for line in text.splitlines() if line.startswith(f"  {function['name']} ")]
        required = set(function["parameters"]["required"])
        for field in function["parameters"]["properties"]:
            assert (f'"{field}"?' in row) is (field not in required), (row, field)
            assert f'"{field}"' in row, (row, field)
    for code in ("0", "1", "2", "3", "130", "141"):
        assert re.search(rf"^  {code} +\S", text, re.M), code


# --- the demo reads as it should ------------------------------------------------------------
def test_the_demo_explains_its_isolation_and_prints_readable_steps() -> None:
    done = cli("demo")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(r"^isolation: commands run in a private pid namespace: they cannot see", out,
                     re.M) or "isolation: no pid namespace here" in out
    assert "pid namespace: True" not in out
    steps = re.split(r"^\[\d+\] ", out, flags=re.M)[1:]
    assert len(steps) == 10
    for step in steps:
        shown = step.split("\n<<< ", 1)[1].split("\n    metadata: ")[0].splitlines()[1:]
        assert shown and shown[0].strip(), f"a step's output starts blank:\n{step}"
    failing = next(s for s in steps if "exit 3" in s)
    assert "    ./notes/todo.txt\n    ./src/farewell.py\n    ./src/greet.py\n" in failing
    assert "bash: command exited with code 3" in failing


def test_call_model_text_prints_what_a_model_reads(tmp_path: Path) -> None:
    done = cli("call", "bash", '{"command": "seq 3; exit 2"}', "--base-dir", str(tmp_path),
               "--model-text")
    assert done.returncode == 1
    assert done.stdout.startswith("1\n2\n3\n") and "exited with code 2" in done.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(done.stdout)


# --- a bare install: no extras at all -------------------------------------------------------
BARE = textwrap.dedent("""
    import sys
    for sdk in ("podman", "docker", "requests", "mcp", "mcp_types", "uvicorn"):
        sys.modules[sdk] = None  # as if no extra were installed
    from toolseam.frontends.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_the_command_line_works_without_any_extra(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("hello\n")

    def bare(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", BARE, *args], capture_output=True, text=True,
                              timeout=60)

    read = bare("call", "read", '{"path": "f.txt"}', "--base-dir", str(tmp_path))
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["output"].startswith("00001| hello")
    assert bare("--version").returncode == 0
    assert "recover" in bare("--help").stdout
    for args, needs in ((("mcp", "--base-dir", str(tmp_path)), "mcp"),
                        (("call", "bash", "{}", "--backend", "podman"), "podman"),
                        (("recover", "--backend", "docker", "--list"), "docker")):
        done = bare(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
        assert "pip install" in done.stderr and f"toolseam[{needs}]" in done.stderr, done.stderr


def test_bare_toolseam_names_its_commands_and_python_dash_m_works() -> None:
    done = cli()
    assert done.returncode == 2
    assert done.stderr.startswith("toolseam: choose a command: call, tools, demo, serve, mcp")
    module = subprocess.run([sys.executable, "-m", "toolseam", "--version"], capture_output=True,
                            text=True, timeout=60)
    assert module.returncode == 0 and module.stdout.startswith("toolseam ")


async def test_base_dir_may_be_a_path_or_start_with_a_tilde(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "f.txt").write_text("here\n")
    async with Toolkit("host", base_dir=tmp_path / "proj", confine_to_base_dir=True) as toolkit:
        assert toolkit.base_dir == str(tmp_path / "proj")
        assert (await toolkit.call("bash", {"command": "cat f.txt"})).output == "here\n"
    monkeypatch.setenv("HOME", str(tmp_path))
    async with Toolkit("host", base_dir="~/proj") as toolkit:
        assert toolkit.base_dir == str(tmp_path / "proj")
        assert (await toolkit.call("read", {"path": "f.txt"})).output.startswith("00001| here")
        assert (await toolkit.call("bash", {"command": "pwd"})).output == f"{tmp_path / 'proj'}\n"


async def test_call_takes_the_arguments_as_json_text_too(tmp_path: Path) -> None:
    """Providers hand a tool call's arguments over as JSON text (OpenAI's function.arguments)."""
    async with Toolkit("host", base_dir=str(tmp_path)) as toolkit:
        assert (await toolkit.call("bash", '{"command": "echo hi"}')).output == "hi\n"
        assert (await toolkit.call("bash", b'{"command": "echo b"}')).output == "b\n"
        for bad in ('["echo"]', "echo hi", '"{}"', ""):
            result = await toolkit.call("bash", bad)
            assert result.is_error and result.output == "bash: arguments must be a JSON object"


def test_a_sync_toolkit_refused_at_open_leaves_no_thread(tmp_path: Path) -> None:
    import threading

    before = {t for t in threading.enumerate() if t.name == "toolseam-sync"}
    tools = SyncToolkit("host", base_dir=str(tmp_path / "nope"))  # still referenced after
    with pytest.raises(ConfigurationError, match="does not exist"), tools:
        pass
    assert {t for t in threading.enumerate() if t.name == "toolseam-sync"} == before


def test_call_reads_json_args_from_stdin_with_a_dash(tmp_path: Path) -> None:
    content = "it's \"quoted\" — no shell quoting needed\n"
    done = subprocess.run([*TOOLSEAM, "call", "write", "-", "--base-dir", str(tmp_path)],
                          input=json.dumps({"path": "w.txt", "content": content}),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "w.txt").read_text() == content


async def test_arguments_text_too_deep_or_not_strict_json_is_a_tool_error(tmp_path: Path) -> None:
    """A model's arguments text nested 100 000 deep raised RecursionError out of the call, and
    NaN was taken as a number: both are text the builtin refuses in its own words."""
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        deep = await tk.call("bash", "[" * 100_000)
        nan = await tk.call("bash", '{"command": "echo hi", "timeout": NaN}')
        fine = await tk.call("bash", '{"command": "echo hi"}')
    assert deep.is_error and "JSON object" in deep.output
    assert nan.is_error and "JSON object" in nan.output
    assert not fine.is_error and fine.output == "hi\n"


# --- a misspelt backend option (issue 46) ---------------------------------------------------
@pytest.mark.parametrize(("backend", "given", "guess"), [
    ("docker", "imgae", "image"), ("podman", "endpiont", "endpoint"), ("host", "netwrok", "network")])
def test_a_misspelt_backend_option_is_named_with_the_valid_ones(backend: str, given: str,
                                                                guess: str) -> None:
    """Not ``TypeError: DockerBackend.__init__() got an unexpected keyword argument``: the
    option in the user's terms, what it may have meant, and what the backend takes."""
    with pytest.raises(ConfigurationError) as caught:
        Toolkit(backend, backend_options={given: "x"})
    message = str(caught.value)
    assert message.startswith(f"backend_options: unknown option {given!r} (did you mean "
                              f"{guess!r}?) for the {backend} backend; it takes "), message
    assert "__init__" not in message


# --- errors in the terms of the interface used (issue 46) -----------------------------------
@pytest.mark.parametrize(("python", "cli_words"), [
    ("or pass workspace_mode='copy'", "or pass --workspace-mode copy"),
    ("endpoint='unix:///run/user/UID/podman/podman.sock' or", "--endpoint "
     "unix:///run/user/UID/podman/podman.sock or"),
    ('image="my/img:1", pull=\'never\' and rootless=True', "--image my/img:1, --pull never and "
     "--rootless"),
    ("the file reimage='x' stays", "the file reimage='x' stays")])
def test_the_cli_words_an_option_as_its_flag(python: str, cli_words: str) -> None:
    assert in_cli_terms(python) == cli_words


@pytest.mark.engines
def test_the_cli_says_workspace_mode_copy_as_its_flag() -> None:
    """The rootless engine's user cannot reach a 0700 root directory: the CLI names its own
    flag, the library its option."""
    rootless = engines.endpoint("podman-rootless")
    done = cli("call", "bash", '{"command": "true"}', "--backend", "podman", "--rootless",
               "--endpoint", rootless, "--image", engines.IMAGE, "--workspace", "/root",
               "--workspace-mode", "bind")
    assert done.returncode == 2, done
    assert done.stderr.rstrip().endswith("or pass --workspace-mode copy"), done.stderr
    assert "workspace_mode=" not in done.stderr


@pytest.mark.engines
def test_rootless_as_root_names_the_variable_and_the_option(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path) -> None:
    """Root has no rootless engine of its own: the error says how to name another user's."""
    engines.endpoint("podman-rootless")  # the rootless engine is part of this machine's setup
    monkeypatch.delenv("TOOLSEAM_PODMAN_ROOTLESS_URL", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with pytest.raises(CouldNotRunError) as caught, SyncToolkit(
            "podman", base_dir=str(tmp_path), backend_options={"rootless": True}):
        pass
    reason = caught.value.reason
    assert reason.startswith(f"podman-rootless engine unreachable at unix:///run/user/"
                             f"{os.geteuid()}/podman/podman.sock"), reason
    if os.geteuid() == 0:
        assert reason.endswith("running as root, rootless podman is another user's engine: "
                               "name that user's socket with endpoint='unix:///run/user/UID/"
                               "podman/podman.sock' or the TOOLSEAM_PODMAN_ROOTLESS_URL "
                               "variable"), reason
        env = {k: v for k, v in os.environ.items()
               if k not in ("TOOLSEAM_PODMAN_ROOTLESS_URL", "XDG_RUNTIME_DIR")}
        done = subprocess.run([*TOOLSEAM, "call", "bash", '{"command": "true"}', "--backend",
                               "podman", "--rootless", "--image", engines.IMAGE],
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 3
        assert ("with --endpoint unix:///run/user/UID/podman/podman.sock or the "
                "TOOLSEAM_PODMAN_ROOTLESS_URL variable") in done.stdout, done.stdout


@pytest.mark.parametrize("engine", ["podman", "docker"])
async def test_a_failed_pull_says_the_image_is_not_here_and_how_to_load_it(
        engine: str, workspace: Path) -> None:
    image = "localhost/toolseam-no-such-image:46"
    url = engines.endpoint(engine)
    sandbox = engines.backend(engine, str(workspace), image=image)
    with pytest.raises(CouldNotRunError) as caught:
        await sandbox.open()
    await sandbox.close()
    reason = caught.value.reason
    tool = "docker -H" if engine == "docker" else "podman --url"
    assert reason.startswith(f"image {image!r} is not present on the {engine} engine at {url}, "
                             f"and pulling it failed ({engine} could not pull {image!r}"), reason
    assert reason.endswith(f"; load it ({tool} {url} load -i IMAGE.tar) or build it ({tool} "
                           f"{url} build -t {image} DIR) into this engine"), reason
    assert caught.value.retryable  # the registry may come back


@pytest.mark.parametrize("options", [{"backend_options": {"imgae": "x"}},
                                     {"backend_options": {"endpoint": "unix:///nonexistent.sock"}}],
                         ids=["misspelt-option", "engine-unreachable"])
async def test_a_workspace_whose_open_fails_leaves_no_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, options: dict[str, Any]) -> None:
    """pydantic-ai's ``ToolseamWorkspace`` makes its directory at open: a failed open removes
    it (temp directories here are made in tmp_path, so another test's cannot be counted)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = ToolseamWorkspace("podman", image="my/img:1", secret_store=tmp_path / "secrets",
                             **options)
    with pytest.raises((ConfigurationError, CouldNotRunError)):
        await made.working_dir()
    assert list(tmp_path.glob("toolseam-workspace-*")) == []
