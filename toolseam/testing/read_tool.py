"""``ReadToolContract``: the read tool as models trained on opencode expect it, through a
Toolkit on the bound backend (issues 33, 46) — an image is known by its bytes whatever its
name; the image types opencode attaches (PNG, JPEG, GIF, WebP) are attachments, and a file
named for another (bmp, tiff, avif) is read as text when it is text, as opencode's current
tests have it; a page is capped at 50 KB with opencode's hint naming the offset to continue
from.

Bind it with the other parts (``toolseam.testing.contract``); files are made through the
backend itself, so in-memory and copy-mode backends run it too.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from toolseam import Toolkit, ToolResult

from .contract import Sandbox, _Bound


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


# one red pixel in each format, as an image library writes it
PNG = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
       + _chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + _chunk(b"IEND", b""))
BMP = (b"BM" + struct.pack("<IHHI", 58, 0, 0, 54)
       + struct.pack("<IiiHHIIiiII", 40, 1, 1, 1, 24, 0, 4, 0, 0, 0, 0) + b"\x00\x00\xff\x00")
TIFF = (b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 4)
        + b"".join(struct.pack("<HHII", tag, 3, 1, value)
                   for tag, value in ((256, 1), (257, 1), (258, 8), (273, 62)))
        + struct.pack("<I", 0) + b"\xff")


class ReadToolContract(_Bound):
    @pytest_asyncio.fixture
    async def toolkit(self, sandbox: Sandbox) -> AsyncIterator[Toolkit]:
        toolkit = Toolkit(sandbox.backend, base_dir=sandbox.base)
        await toolkit.open()
        yield toolkit

    async def _read(self, toolkit: Toolkit, sandbox: Sandbox, name: str, data: bytes,
                    **args: object) -> ToolResult:
        await sandbox.put({name: data})
        return await toolkit.call("read", {"path": name, **args})

    @pytest.mark.parametrize("name", ["image.bin", "image.dat", "image.txt", "image"])
    async def test_an_image_is_known_by_its_bytes_whatever_its_name(
            self, sandbox: Sandbox, toolkit: Toolkit, name: str) -> None:
        result = await self._read(toolkit, sandbox, name, PNG)
        assert (result.is_error, result.output) == (False, f"{name} (image/png, {len(PNG)} bytes)")
        assert result.parts is not None and result.parts[0]["type"] == "image"
        assert base64.b64decode(result.parts[0]["data"]) == PNG

    @pytest.mark.parametrize(("name", "text"), [
        ("image.bmp", "BM text content"), ("photo.tiff", "II text content"),
        ("photo.tif", "II text content"), ("photo.avif", "avif text content")])
    async def test_unsupported_image_types_fall_through_to_text(
            self, sandbox: Sandbox, toolkit: Toolkit, name: str, text: str) -> None:
        """opencode's ``falls through unsupported image mime types to text``."""
        result = await self._read(toolkit, sandbox, name, text.encode())
        assert (result.is_error, result.parts) == (False, None)
        assert result.output == f"00001| {text}\n\n(end of file, 1 line)"

    @pytest.mark.parametrize(("name", "data", "what"), [
        ("pixel.bmp", BMP, "a BMP image"), ("pixel.tiff", TIFF, "a TIFF image"),
        ("bmp-without-a-name", BMP, "a BMP image")])
    async def test_bmp_and_tiff_bytes_are_binary_and_named(
            self, sandbox: Sandbox, toolkit: Toolkit, name: str, data: bytes, what: str) -> None:
        """No model takes them as images: refused as binary, saying what they are."""
        result = await self._read(toolkit, sandbox, name, data)
        assert result.is_error and result.parts is None
        assert result.output == (f"read: {name} is a binary file ({what}, not a type a model "
                                 "takes); it cannot be read as text")

    async def test_a_binary_name_without_an_image_inside_is_still_refused(
            self, sandbox: Sandbox, toolkit: Toolkit) -> None:
        result = await self._read(toolkit, sandbox, "blob.bin", b"\x00\x01plain")
        assert (result.is_error, result.output) == (
            True, "read: blob.bin is a binary file (.bin); it cannot be read as text")
        text = await self._read(toolkit, sandbox, "notes.txt", b"BM is how this note starts\n")
        assert text.output == "00001| BM is how this note starts\n\n(end of file, 1 line)"

    async def test_a_page_is_capped_at_50_kb_and_says_where_to_continue(
            self, sandbox: Sandbox, toolkit: Toolkit) -> None:
        body = b"".join(b"%04d " % n + b"x" * 995 + b"\n" for n in range(1, 301))  # 300 KB
        first = await self._read(toolkit, sandbox, "wide.txt", body)
        lines = first.output.split("\n")
        assert lines[0].startswith("00001| 0001 ") and lines[50].startswith("00051| 0051 ")
        assert lines[-1] == "(Output capped at 50 KB. Showing lines 1-51. Use offset=52 to continue.)"
        assert len(first.output.encode()) < 50 * 1024 + 51 * 8 + 100  # the cap, plus numbering
        assert (first.metadata["next"], first.metadata["truncated"]) == (52, True)
        rest = await toolkit.call("read", {"path": "wide.txt", "offset": 52})
        assert rest.output.startswith("00052| 0052 ")
        assert rest.output.endswith("(Output capped at 50 KB. Showing lines 52-102. Use offset=103 "
                                    "to continue.)")
        by_lines = await toolkit.call("read", {"path": "wide.txt", "limit": 3})
        assert by_lines.output.endswith("(showing lines 1-3; the file has more: read on with "
                                        "offset=4)")

    async def test_a_60_kib_json_file_stops_at_the_cap(self, sandbox: Sandbox,
                                                       toolkit: Toolkit) -> None:
        """opencode's ``truncates large file by bytes``: pretty-printed JSON of at least
        60 KiB (its models-api fixture's shape: short indented lines) ends at the cap with
        ``Output capped at`` and ``Use offset=``, in the output and in the model's text."""
        entry = ('    "model-{n}": {{\n      "id": "model-{n}",\n      "name": "Model {n}",\n'
                 '      "release_date": "2025-12-02",\n'
                 '      "modalities": {{ "input": ["text", "image"], "output": ["text"] }},\n'
                 '      "limit": {{ "context": 262144, "output": 65536 }}\n    }},\n')
        body = "{\n" + "".join(entry.format(n=n) for n in range(260)) + "}\n"
        assert 60 * 1024 <= len(body) < 64 * 1024 and body.count("\n") < 2000
        result = await self._read(toolkit, sandbox, "large.json", body.encode())
        assert result.metadata["truncated"] is True
        last = result.output.rsplit("\n", 1)[1]
        assert last.startswith("(Output capped at 50 KB. Showing lines 1-"), last
        assert f"Use offset={result.metadata['next']} to continue.)" in last
        assert "Use offset=" in result.model_text()
        shown = result.output.rsplit("\n\n", 1)[0].split("\n")
        assert sum(len(line.split("| ", 1)[1]) + 1 for line in shown) <= 50 * 1024
