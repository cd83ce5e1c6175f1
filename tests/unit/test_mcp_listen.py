"""Where ``toolseam mcp --http`` listens (``frontends/mcp/listen.py``): the address forms, a
unix socket that is the owner's from its first moment, a stale one of ours replaced and
anything else at the path refused, a generated token's file owner-only. No server runs."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam.frontends.mcp.listen import (
    TcpAddress,
    UnixAddress,
    generate_token_file,
    listen_unix,
    parse_address,
)
from toolseam.seam.errors import ConfigurationError


def test_the_address_forms() -> None:
    assert parse_address("127.0.0.1:8765") == TcpAddress("127.0.0.1", 8765)
    assert parse_address("[::1]:0") == TcpAddress("::1", 0)
    assert parse_address("unix:/run/x.sock") == UnixAddress("/run/x.sock")
    assert parse_address("unix:rel.sock") == UnixAddress(os.path.abspath("rel.sock"))
    for bad, words in (("nowhere", "HOST:PORT or unix:PATH"), ("host:", "HOST:PORT"),
                       ("127.0.0.1:99999", "a port is 0-65535"), ("unix:", "needs a path")):
        with pytest.raises(ConfigurationError, match=words):
            parse_address(bad)


@given(st.text(max_size=40))
def test_any_text_is_an_address_or_a_configuration_error(text: str) -> None:
    try:
        address = parse_address(text)
    except ConfigurationError as exc:
        assert "--http" in str(exc)
    else:
        assert isinstance(address, (TcpAddress, UnixAddress))


def test_a_unix_socket_is_0600_and_a_stale_one_of_ours_is_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "mcp.sock")
    old = os.umask(0)  # a socket that followed the umask would be 0777 now
    try:
        first = listen_unix(path)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert os.umask(0) == 0  # and listen_unix put the umask back
        with pytest.raises(ConfigurationError, match="a server is listening there"):
            listen_unix(path)
        first.close()  # killed without removing its socket: nobody serves it now
        second = listen_unix(path)
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(path)
        second.close()
    finally:
        os.umask(old)


def test_anything_else_at_the_path_is_left_alone(tmp_path: Path) -> None:
    kept = tmp_path / "notes.txt"
    kept.write_text("mine")
    with pytest.raises(ConfigurationError, match="something else is there"):
        listen_unix(str(kept))
    assert kept.read_text() == "mine"


def test_a_generated_token_is_the_owners_alone() -> None:
    token, path = generate_token_file()
    try:
        assert len(token) == 64 and path.read_text() == token + "\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert path.stat().st_uid == os.geteuid()
    finally:
        path.unlink()
