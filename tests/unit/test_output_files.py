"""Task output files: exclusive no-follow creation, bounded delta reads and tails."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.core.errors import UnsafePathError
from shoal.core.output import (
    create_output_file,
    output_size,
    read_output_delta,
    read_window,
    tail,
    tail_lines,
)
from shoal.core.tasks import OUTPUT_READ_CHUNK


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def test_create_output_file_is_private_and_appends(tmp_path: Path) -> None:
    path = tmp_path / "b12345678.output"
    fd = create_output_file(path)
    try:
        write_all(fd, b"hello ")
        os.lseek(fd, 0, os.SEEK_SET)  # O_APPEND: writes still go to the end
        write_all(fd, b"world\n")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"hello world\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_planted_symlink_is_refused_and_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    link = tmp_path / "b12345678.output"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError, match="symlink") as info:
        create_output_file(link)
    assert str(link) in str(info.value)
    assert target.read_bytes() == b"precious"
    assert link.is_symlink()


def test_dangling_symlink_is_refused_and_nothing_created(tmp_path: Path) -> None:
    target = tmp_path / "would-be-created"
    link = tmp_path / "b12345678.output"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError):
        create_output_file(link)
    assert not target.exists()


def test_existing_file_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "b12345678.output"
    path.write_bytes(b"old output")
    with pytest.raises(UnsafePathError, match="already exists as a file"):
        create_output_file(path)
    assert path.read_bytes() == b"old output"


def test_symlinked_parent_is_refused_with_root(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "home"
    (root / "sessions" / "s1").mkdir(parents=True)
    (root / "sessions" / "s1" / "tasks").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="symlink"):
        create_output_file(root / "sessions" / "s1" / "tasks" / "b12345678.output", root=root)
    assert list(elsewhere.iterdir()) == []


def test_read_delta_from_offsets(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"0123456789")
    assert read_output_delta(path, 0) == (b"0123456789", 10)
    assert read_output_delta(path, 4) == (b"456789", 10)
    assert read_output_delta(path, 10) == (b"", 10)
    assert read_output_delta(path, 25) == (b"", 25)
    with path.open("ab") as f:
        f.write(b"abc")
    assert read_output_delta(path, 10) == (b"abc", 13)


def test_read_delta_missing_file(tmp_path: Path) -> None:
    assert read_output_delta(tmp_path / "nope", 7) == (b"", 7)
    assert output_size(tmp_path / "nope") == 0


def test_read_delta_respects_chunk_limit(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    data, offset = read_output_delta(path, 100, max_bytes=1000)
    assert (len(data), offset) == (1000, 1100)
    assert data == path.read_bytes()[100:1100]
    pieces = []
    offset = 0
    while True:
        data, offset = read_output_delta(path, offset, max_bytes=3000)
        assert len(data) <= 3000
        if not data:
            break
        pieces.append(data)
    assert b"".join(pieces) == path.read_bytes()
    assert [len(p) for p in pieces] == [3000, 3000, 3000, 1240]


def test_default_chunk_is_8_mib(tmp_path: Path) -> None:
    path = tmp_path / "big"
    with path.open("wb") as f:
        f.truncate(OUTPUT_READ_CHUNK + 5)
    data, offset = read_output_delta(path, 0)
    assert len(data) == OUTPUT_READ_CHUNK == 8 * 1024 * 1024
    assert offset == OUTPUT_READ_CHUNK
    assert read_output_delta(path, offset) == (b"\0" * 5, OUTPUT_READ_CHUNK + 5)


def test_reading_through_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"secret")
    link = tmp_path / "out"
    link.symlink_to(target)
    with pytest.raises(UnsafePathError):
        read_output_delta(link, 0)
    with pytest.raises(UnsafePathError):
        output_size(link)
    with pytest.raises(UnsafePathError):
        tail(link)


def test_bad_arguments(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"x")
    with pytest.raises(ValueError):
        read_output_delta(path, -1)
    with pytest.raises(ValueError):
        read_output_delta(path, 0, max_bytes=0)


@given(st.binary(max_size=600), st.integers(0, 700), st.integers(1, 300))
def test_delta_matches_slice(
    tmp_path_factory: pytest.TempPathFactory, blob: bytes, offset: int, size: int
) -> None:
    path = tmp_path_factory.mktemp("delta") / "out"
    path.write_bytes(blob)
    data, new_offset = read_output_delta(path, offset, size)
    assert data == blob[offset : offset + size]
    assert new_offset == offset + len(data)


def test_output_size_and_tail(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"line one\nline two\nline three\n")
    assert output_size(path) == 29
    assert tail(path) == "line one\nline two\nline three\n"
    assert tail(path, max_bytes=11) == "line three\n"
    path.write_bytes(b"ok \xff\xfe bad\n")
    assert tail(path) == "ok \ufffd\ufffd bad\n"


def test_tail_lines(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"".join(f"line {i}\n".encode() for i in range(100)))
    assert tail_lines(path, 3) == ["line 97", "line 98", "line 99"]
    # A 13-byte window "e 98\nline 99\n" holds one cut line, which is dropped.
    assert tail_lines(path, 5, max_bytes=13) == ["line 99"]
    # A window that starts exactly on a line boundary keeps that whole line.
    assert tail_lines(path, 5, max_bytes=16) == ["line 98", "line 99"]
    assert tail_lines(path, 0) == []
    assert tail_lines(tmp_path / "missing") == []


@given(st.text(min_size=1, max_size=60), st.integers(1, 16), st.integers(0, 250))
def test_read_window_pages_whole_characters(text: str, width: int, at: int) -> None:
    """Windows that cut a multi-byte character leave it whole to the window beside it, and
    paging on by each window's end gives back the file exactly."""
    import tempfile

    data = text.encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out"
        path.write_bytes(data)
        shown, start, end, size = read_window(path, None, max(width, 4))
        assert size == len(data) and end == size and data[start:].decode() == shown
        offset, pages = min(at, len(data)), []
        while 0 < offset < len(data) and data[offset] & 0xC0 == 0x80:
            offset -= 1  # (start the paging on a character boundary)
        first = offset
        while offset < len(data):
            page, start, end, _ = read_window(path, offset, max(width, 4))
            assert start == offset and data[start:end].decode() == page
            pages.append(page)
            offset = end
        assert "".join(pages) == data[first:].decode()
