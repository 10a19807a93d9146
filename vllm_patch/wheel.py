"""Reading single files out of a vLLM wheel on the package index, without downloading it.

A vLLM wheel is 250-340 MB, but the registry answers HTTP range requests, and
a wheel is a zip: its central directory (at the end) says where each member
lies.  `RemoteWheel` is a read-only, seekable file over HTTP ranges that
`zipfile` reads as it would a local file; it caches what it fetched in
blocks, and `prefetch` turns the reads of many members into a few large
requests.  Every member read is checked against the CRC-32 that the central
directory records (zipfile does this); the release tests compare the files the
patch changes with the sha256 the release table records
(tests/vllm_patch/test_releases.py).

The index is PyPI's simple API (PEP 691 JSON); $SR_PREFETCH_INDEX_URL names
another one that speaks it.
"""

from __future__ import annotations

import io
import json
import os
import re
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_INDEX = "https://pypi.org/simple"
_WHEEL_NAME = r"vllm-{version}-(?:(?P<build>\d+)-)?cp\d+-abi3-manylinux_\d+_\d+_x86_64\.whl"
"""The wheel whose Python sources are read (every platform's ships the same ones): the
x86-64 manylinux one, the first upload rather than a numbered rebuild (`-1-`)."""

_BLOCK = 1 << 16
_TIMEOUT_S = 60
_ATTEMPTS = 3
_USER_AGENT = "sr-prefetch (range reads of single wheel members)"


class WheelError(Exception):
    """A wheel could not be found or read from the index; the message says which and why."""


@dataclass(frozen=True)
class WheelFile:
    """One wheel file on the index."""

    filename: str
    url: str
    sha256: str
    size: int


def index_url() -> str:
    return os.environ.get("SR_PREFETCH_INDEX_URL", DEFAULT_INDEX).rstrip("/")


def index_files() -> list[dict]:
    """vLLM's files on the index: the `files` of its PEP 691 project page."""
    url = f"{index_url()}/vllm/"
    request = urllib.request.Request(
        url, headers={"Accept": "application/vnd.pypi.simple.v1+json", "User-Agent": _USER_AGENT}
    )
    try:
        page = json.loads(urlopen(request).read())
    except (OSError, ValueError) as error:
        raise WheelError(f"cannot list vLLM's files at {url}: {error}") from None
    return page.get("files", [])


def find_wheel(version: str) -> WheelFile:
    """The x86-64 manylinux wheel of vLLM `version` on the index."""
    url = f"{index_url()}/vllm/"
    pattern = re.compile(_WHEEL_NAME.format(version=re.escape(version)))
    found = [
        (int(match.group("build") or 0), entry)
        for entry in index_files()
        if (match := pattern.fullmatch(entry["filename"])) and not entry.get("yanked")
    ]
    if not found:
        raise WheelError(f"the index at {url} has no x86-64 manylinux wheel of vLLM {version}")
    entry = min(found, key=lambda pair: pair[0])[1]
    return WheelFile(entry["filename"], entry["url"], entry["hashes"]["sha256"], int(entry["size"]))


class RemoteWheel(io.RawIOBase):
    """A wheel on the index as a seekable, read-only binary file (HTTP range reads)."""

    def __init__(self, wheel: WheelFile) -> None:
        super().__init__()
        self.wheel = wheel
        self._position = 0
        self._blocks: dict[int, bytes] = {}

    # -- io.RawIOBase --------------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.wheel.size}
        self._position = max(0, base[whence] + offset)
        return self._position

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        end = min(self._position + len(buffer), self.wheel.size)
        if end <= self._position:
            return 0
        data = self._read_range(self._position, end)
        buffer[: len(data)] = data
        self._position += len(data)
        return len(data)

    # -- what the patch uses ---------------------------------------------------------------

    def prefetch(self, spans: Iterable[tuple[int, int]], max_gap: int = 1 << 20) -> None:
        """Fetches the byte ranges `spans` ([start, end) each) in as few requests as
        possible: spans closer than `max_gap` are fetched as one."""
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start - merged[-1][1] <= max_gap:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in merged:
            first = start // _BLOCK * _BLOCK
            last = min(-(-end // _BLOCK) * _BLOCK, self.wheel.size)
            if all(b in self._blocks for b in range(first, last, _BLOCK)):
                continue
            data = self._get(first, last)
            for offset in range(0, len(data), _BLOCK):
                self._blocks[first + offset] = data[offset : offset + _BLOCK]

    def _read_range(self, start: int, end: int) -> bytes:
        first = start // _BLOCK * _BLOCK
        missing = [b for b in range(first, end, _BLOCK) if b not in self._blocks]
        if missing:
            self.prefetch([(missing[0], min(missing[-1] + _BLOCK, self.wheel.size))], max_gap=0)
        data = b"".join(self._blocks[b] for b in range(first, end, _BLOCK))
        return data[start - first : end - first]

    def _get(self, start: int, end: int) -> bytes:
        request = urllib.request.Request(
            self.wheel.url,
            headers={"Range": f"bytes={start}-{end - 1}", "User-Agent": _USER_AGENT},
        )
        try:
            response = urlopen(request)
            data = response.read()
        except OSError as error:
            raise WheelError(f"cannot read {self.wheel.filename}: {error}") from None
        if response.status != 206 or len(data) != end - start:
            raise WheelError(
                f"{self.wheel.filename}: asked for bytes {start}-{end - 1}, got HTTP "
                f"{response.status} with {len(data)} bytes; the index must answer range requests"
            )
        return data


def read_members(
    version: str, wanted: Iterable[str] | None = None, *, skip_binaries: bool = True
) -> dict[str, bytes]:
    """Members of vLLM `version`'s wheel: those named in `wanted` (all must exist), or,
    with `wanted` None, every file but compiled binaries (`*.so`): the Python sources
    and data a source tree has, and the dist-info."""
    wheel = RemoteWheel(find_wheel(version))
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as error:
        raise WheelError(f"{wheel.wheel.filename} is not a readable zip: {error}") from None
    with archive:
        infos = {info.filename: info for info in archive.infolist() if not info.is_dir()}
        if wanted is None:
            names = [n for n in infos if not (skip_binaries and _is_binary(n))]
        else:
            names = list(wanted)
            absent = [name for name in names if name not in infos]
            if absent:
                raise WheelError(f"{wheel.wheel.filename} has no {', '.join(absent)}")
        ordered = sorted((infos[name] for name in names), key=lambda i: i.header_offset)
        # Local header (30 bytes + name + extra, which may differ from the central one's)
        # then the data: 30 + name + 1 KiB of slack covers it in the same request.
        wheel.prefetch(
            (i.header_offset, i.header_offset + 30 + len(i.filename) + 1024 + i.compress_size)
            for i in ordered
        )
        try:
            return {info.filename: archive.read(info) for info in ordered}
        except (zipfile.BadZipFile, OSError) as error:
            raise WheelError(f"{wheel.wheel.filename}: {error}") from None


def _is_binary(name: str) -> bool:
    return name.endswith(".so") or ".so." in name.rsplit("/", 1)[-1]


def urlopen(request: urllib.request.Request):
    error: OSError | None = None
    for _ in range(_ATTEMPTS):
        try:
            return urllib.request.urlopen(request, timeout=_TIMEOUT_S)
        except urllib.error.HTTPError:
            raise
        except OSError as caught:  # a dropped connection or a time-out: try again
            error = caught
    assert error is not None
    raise error
