"""A workload's input file (a trace, an empirical length CSV), read once into memory.

The readers parse the bytes read here, never the path, so what the file holds decides how it
is read, whatever its name says: a gzip, bzip2, xz, zip or (with the ``zstandard`` package,
as for pandas) Zstandard file is decompressed (known by its first bytes), a UTF-8
byte-order mark is dropped. A pipe or FIFO (``<(zcat trace.jsonl.gz)``,
``/dev/fd/N``) can be read only once, and a run reads its input twice (``validate_config``
first, then the run itself), so a stream's content is kept for the process. An error about a
row names the line of the file where the row starts, as an editor numbers it.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import functools
import gzip
import io
import itertools
import lzma
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scenarios.errors import WorkloadError

NOT_BLANK = re.compile(rb"\S")


def _unzip(data: bytes) -> bytes:
    """The one file a zip archive holds (as pandas reads a zipped CSV)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        names = archive.namelist()
        if len(names) != 1:
            raise ValueError(f"an archive of one file, not {len(names)}")
        return archive.read(names[0])


# (first bytes, name, decompress) of the compressions the standard library reads
COMPRESSIONS = ((b"\x1f\x8b", "gzip", gzip.decompress), (b"BZh", "bzip2", bz2.decompress),
                (b"\xfd7zXZ\x00", "xz", lzma.decompress), (b"PK\x03\x04", "zip", _unzip))


@dataclass(frozen=True)
class InputFile:
    """One input file's content (decompressed) and where its rows start."""

    path: str
    data: bytes

    def text(self, newline: str | None = None) -> io.TextIOWrapper:
        """The content as text, a byte-order mark dropped (``newline`` as for ``open``)."""
        return io.TextIOWrapper(io.BytesIO(self.data), encoding="utf-8-sig", newline=newline)

    def buffer(self) -> io.BytesIO:
        """The content as a binary stream, for ``pandas.read_csv(..., encoding="utf-8-sig")``."""
        return io.BytesIO(self.data)

    @functools.cached_property
    def is_json_lines(self) -> bool:
        """Whether the first character that is not blank opens a JSON object."""
        start = len(codecs.BOM_UTF8) if self.data.startswith(codecs.BOM_UTF8) else 0
        first = NOT_BLANK.search(self.data, start)
        return first is not None and first.group() == b"{"

    def line(self, row: int) -> int | None:
        """The line (1-based, as an editor numbers them) where data row ``row`` (0-based, in
        file order) starts: JSON lines are the file's lines that are not blank; a CSV's rows
        are its records after the header, blank lines skipped and a quoted cell spanning
        lines, as pandas reads them (None if the file has fewer). Found when asked: only an
        error message needs it."""
        starts = (_json_line_starts(self.text()) if self.is_json_lines
                  else itertools.islice(_csv_record_starts(self.text(newline="")), 1, None))
        return next(itertools.islice(starts, int(row), None), None)

    def row(self, row: int) -> str:
        """``row N (line L)``: a data row as error messages name it."""
        line = self.line(row)
        return f"row {int(row)}" if line is None else f"row {int(row)} (line {line})"


def _json_line_starts(text: Iterator[str]) -> Iterator[int]:
    """The number of each line that is not blank."""
    return (n for n, line in enumerate(text, start=1) if line.strip())


def _csv_record_starts(text: io.TextIOWrapper) -> Iterator[int]:
    """The line where each CSV record that is not blank starts (the header included)."""
    reader = csv.reader(text)
    start = 1
    for record in reader:
        if len(record) > 1 or (record and record[0].strip()):
            yield start
        start = reader.line_num + 1


@functools.lru_cache(maxsize=8)
def _stream_content(path: str, device: int, inode: int) -> bytes:
    """All of a pipe's or FIFO's bytes, read the first time they are asked for (per stream:
    its device and inode) and kept: a second read would find it empty, or block."""
    with open(path, "rb") as f:
        return f.read()


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _unzstd(data: bytes) -> bytes:
    """A Zstandard frame's content, through the ``zstandard`` package (as pandas reads a
    ``.zst`` file); without it, what to do instead."""
    try:
        import zstandard
    except ImportError:
        raise ValueError("the zstandard package is not installed: pip install zstandard, "
                         "or decompress it first (zstd -d)") from None
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            return reader.read()
    except zstandard.ZstdError as e:
        raise ValueError(str(e)) from None


def _decompressed(data: bytes, path: str, field: str) -> bytes:
    """``data``, decompressed when its first bytes are those of a compression in
    ``COMPRESSIONS``."""
    for magic, name, decompress in (*COMPRESSIONS, (ZSTD_MAGIC, "zstd", _unzstd)):
        if data.startswith(magic):
            try:
                return decompress(data)
            except (OSError, EOFError, ValueError, lzma.LZMAError, zlib.error,
                    zipfile.BadZipFile) as e:
                raise WorkloadError(field, path, f"cannot decompress as {name} ({e})") from None
    return data


def read_input_file(path: str, field: str) -> InputFile:
    """The file at ``path`` (the value of config field ``field``), read once (module doc);
    a file that is missing, unreadable or badly compressed is one ``WorkloadError``."""
    try:
        info = os.stat(path)
        if stat.S_ISREG(info.st_mode):
            data = Path(path).read_bytes()
        else:
            data = _stream_content(path, info.st_dev, info.st_ino)
    except FileNotFoundError:
        raise WorkloadError(field, path, "file not found") from None
    except OSError as e:
        raise WorkloadError(field, path, f"cannot read the file ({e.strerror or e})") from None
    return InputFile(path, _decompressed(data, path, field))
