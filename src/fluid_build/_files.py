"""Reading files from user paths: bounded, non-blocking, regular files only, depth-limited.

Every reader here:

- refuses anything that is not a regular file (a directory, a FIFO, a device,
  a socket) at once: the path is ``stat``-ed first, opened with
  ``O_NONBLOCK`` (so a FIFO swapped in after the check cannot block the
  open) and the open descriptor is ``fstat``-ed again;
- reads at most ``limit + 1`` bytes, never the whole file, so a 4 GiB file
  costs no more memory than a small one;
- parses JSON and YAML with a nesting limit (:data:`MAX_DEPTH` levels), so a
  deeply nested document is a :class:`TooDeepError`, never ``RecursionError``.

Errors name the path as the caller chose to show it (``name=``), the limit,
and what to do.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import json
import os
import re
import stat
import tempfile
from typing import Any, Final

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from fluid_build.errors import FluidError

__all__ = [
    "MAX_DEPTH",
    "FileTooLargeError",
    "NotRegularFileError",
    "TooDeepError",
    "UnsafeFileError",
    "file_kind",
    "load_json",
    "load_yaml",
    "open_regular",
    "read_at_most",
    "read_regular",
    "read_text_head",
    "write_atomic",
]

#: The deepest nesting :func:`load_json` and :func:`load_yaml` accept.
MAX_DEPTH: Final = 64

_O_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_READ: Final = (
    os.O_RDONLY
    | _O_NONBLOCK
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
_CHUNK: Final = 1 << 20


class UnsafeFileError(FluidError):
    """A user file that is not read: not a regular file, too large, or nested too deep.

    ``path`` is the name shown in the message; ``reason`` says what was wrong
    without the path.
    """

    def __init__(self, path: str, reason: str, advice: str) -> None:
        self.path = path
        self.reason = reason
        self.advice = advice
        super().__init__(f"{path} {reason}; {advice}")


class NotRegularFileError(UnsafeFileError):
    """A directory, FIFO, device, socket or (where refused) symbolic link, not a regular file."""

    def __init__(self, path: str, kind: str) -> None:
        self.kind = kind
        super().__init__(path, f"is {kind}, not a regular file", "give the path of a regular file")


class FileTooLargeError(UnsafeFileError):
    """A file larger than the reader's limit; nothing past the limit was read."""

    def __init__(self, path: str, limit: int) -> None:
        self.limit = limit
        super().__init__(
            path,
            f"is larger than {_size(limit)} ({limit:,} bytes), the most read here",
            "is it the right file?",
        )


class TooDeepError(UnsafeFileError):
    """A JSON or YAML document nested deeper than the parser's limit."""

    def __init__(self, path: str, limit: int, line: int | None, *, cycle: bool = False) -> None:
        self.limit = limit
        self.line = line
        where = f" (at line {line})" if line is not None else ""
        what = (
            "refers to itself through a YAML alias"
            if cycle
            else f"nests deeper than {limit} levels"
        )
        super().__init__(
            path, f"{what}{where}", "flatten it: no file read here needs that much nesting"
        )


def _size(limit: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if limit >= size and limit % size == 0:
            return f"{limit // size} {unit}"
    if limit >= 1_000_000 and limit % 1_000_000 == 0:
        return f"{limit // 1_000_000} MB"
    return f"{limit:,} bytes"


_KINDS: Final = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """What a ``st_mode`` describes, in words: ``"a regular file"``, ``"a FIFO (named pipe)"``."""
    if stat.S_ISREG(mode):
        return "a regular file"
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "not a file"


def _stat_kind(path: str | os.PathLike[str], dir_fd: int | None, follow: bool) -> str | None:
    """The kind of a non-regular file at ``path``, or None (regular, or cannot stat)."""
    try:
        info = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow)
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(info.st_mode) else file_kind(info.st_mode)


def open_regular(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    dir_fd: int | None = None,
    follow_symlinks: bool = True,
) -> int:
    """A read-only descriptor on the regular file ``path``, opened without blocking.

    Stat, open with ``O_NONBLOCK`` (and ``O_NOFOLLOW`` when
    ``follow_symlinks=False``), then ``fstat`` the descriptor: anything but a
    regular file is a :class:`NotRegularFileError` (``kind`` says what it
    was) and is never read. Other failures are the ``OSError`` of the open.
    The caller closes the descriptor.
    """
    shown = name if name is not None else os.fspath(path)
    kind = _stat_kind(path, dir_fd, follow_symlinks)
    if kind is not None:
        raise NotRegularFileError(shown, kind)
    flags = _O_READ | (0 if follow_symlinks else _O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        # ELOOP (a symlink under O_NOFOLLOW), ENXIO (a socket), EISDIR, EACCES on a
        # directory on Windows ...: name what is there when it is not a regular file.
        kind = _stat_kind(path, dir_fd, follow_symlinks)
        if kind is not None:
            raise NotRegularFileError(shown, kind) from None
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise NotRegularFileError(shown, "a symbolic link") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(shown, file_kind(mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_at_most(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes from ``fd``: fewer only at the end of the file."""
    buffer = bytearray()
    while len(buffer) < size:
        chunk = os.read(fd, min(size - len(buffer), _CHUNK))
        if not chunk:
            break
        buffer += chunk
    return bytes(buffer)


def read_regular(
    path: str | os.PathLike[str],
    *,
    limit: int,
    name: str | None = None,
    dir_fd: int | None = None,
    follow_symlinks: bool = True,
) -> bytes:
    """The whole content of the regular file ``path``, if it is at most ``limit`` bytes.

    Reads at most ``limit + 1`` bytes; a longer file is a
    :class:`FileTooLargeError`. See :func:`open_regular` for what is refused.
    """
    shown = name if name is not None else os.fspath(path)
    fd = open_regular(path, name=shown, dir_fd=dir_fd, follow_symlinks=follow_symlinks)
    try:
        data = read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise FileTooLargeError(shown, limit)
    return data


def read_text_head(fd: int, max_chars: int, *, errors: str = "replace") -> str:
    """The first ``max_chars`` characters of UTF-8 text on ``fd``, reading at most 4 bytes each."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    data = read_at_most(fd, 4 * max_chars)
    text = decoder.decode(data, final=len(data) < 4 * max_chars)
    return text[:max_chars]


# -- parsing with a depth limit ---------------------------------------------------

# A JSON string (escapes included, possibly unterminated), or one bracket.
_JSON_TOKEN: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def _json_depth_error(text: str, max_depth: int, name: str) -> TooDeepError | None:
    depth = 0
    for match in _JSON_TOKEN.finditer(text):
        piece = match.group()
        if piece in "[{":
            depth += 1
            if depth > max_depth:
                line = text.count("\n", 0, match.start()) + 1
                return TooDeepError(name, max_depth, line)
        elif piece in "]}":
            depth -= 1
    return None


def load_json(text: str, *, name: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``, refusing documents nested deeper than ``max_depth``.

    The nesting is measured before parsing (strings skipped), so the parser
    never recurses past the limit. Invalid JSON raises ``json.JSONDecodeError``
    as usual.
    """
    too_deep = _json_depth_error(text, max_depth, name)
    if too_deep is not None:
        raise too_deep
    try:
        return json.loads(text)
    except RecursionError:  # pragma: no cover - the scan above measures the same nesting
        raise TooDeepError(name, max_depth, None) from None


class _YamlTooDeep(yaml.YAMLError):
    def __init__(self, line: int | None, *, cycle: bool = False) -> None:
        super().__init__("too deep")
        self.line = line
        self.cycle = cycle


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that stops composing past a nesting limit, aliases included.

    The composer is PyYAML's only recursive stage (the parser and the safe
    constructor are iterative). Each node's height is kept, so an alias placed
    at depth ``d`` counts as ``d`` plus the height of what it points to, and an
    alias to a node still being composed (a recursive structure) is refused.
    """

    max_depth = MAX_DEPTH

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._heights: dict[int, int] = {}

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            line = self._line()
            if self._depth > self.max_depth:
                raise _YamlTooDeep(line)
            alias = self.check_event(AliasEvent)
            node = super().compose_node(parent, index)
            if node is None:  # pragma: no cover - PyYAML always returns a node here
                return None
            height = self._heights.get(id(node))
            if height is None:
                if alias:  # an alias to a node still being composed: a cycle
                    raise _YamlTooDeep(line, cycle=True)
                height = self._height(node)
                self._heights[id(node)] = height
            if self._depth - 1 + height > self.max_depth:
                raise _YamlTooDeep(line)
            return node
        finally:
            self._depth -= 1

    def _line(self) -> int:
        event: Any = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in the stubs
        return int(event.start_mark.line) + 1

    def _height(self, node: Node) -> int:
        if isinstance(node, SequenceNode):
            children: list[Node] = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            return 1
        return 1 + max((self._heights.get(id(child), 1) for child in children), default=0)


def load_yaml(text: str, *, name: str, max_depth: int = MAX_DEPTH) -> Any:
    """``yaml.safe_load(text)``, refusing documents nested deeper than ``max_depth``.

    Other YAML problems raise ``yaml.YAMLError`` as usual.
    """
    loader = _BoundedLoader(text)
    loader.max_depth = max_depth
    try:
        return loader.get_single_data()
    except _YamlTooDeep as exc:
        raise TooDeepError(name, max_depth, exc.line, cycle=exc.cycle) from None
    except RecursionError:  # pragma: no cover - the composer stops long before
        raise TooDeepError(name, max_depth, None) from None
    finally:
        loader.dispose()


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the whole new one.

    The bytes go to a temporary file in the same directory (mode 0600, as
    ``mkstemp`` makes it), synced, then renamed over ``path``; nothing is
    left behind if writing is interrupted. The directory must exist.
    """
    target = os.fspath(path)
    directory, name = os.path.split(target)
    fd, temp = tempfile.mkstemp(dir=directory or ".", prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
