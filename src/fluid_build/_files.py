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

Writing to user paths (``--out``) is checked before any work is paid for:
:func:`check_output_file` and :func:`check_output_dir` refuse, with an
:class:`OutputPathError`, a target that cannot be written (its directory
missing, a file where a directory must be, a read-only place), by really
creating and removing a probe there. A regular file is then replaced whole
(:func:`write_atomic`); a FIFO, a terminal or ``/dev/stdout`` is streamed into
(:func:`open_output`, :func:`write_all`), never replaced. :func:`save_aside`
keeps bytes that could not reach their target in a private file.
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
from dataclasses import dataclass
from typing import Any, Final

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from fluid_build.errors import FluidError

__all__ = [
    "MAX_DEPTH",
    "FileTooLargeError",
    "NotRegularFileError",
    "OutputFile",
    "OutputPathError",
    "TooDeepError",
    "UnsafeFileError",
    "check_output_dir",
    "check_output_file",
    "file_kind",
    "load_json",
    "load_yaml",
    "open_output",
    "open_regular",
    "read_at_most",
    "read_regular",
    "read_text_head",
    "save_aside",
    "write_all",
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


# -- writing to user paths ---------------------------------------------------------


class OutputPathError(FluidError):
    """An output path that cannot be written: refused before any work, or failed at the end.

    ``path`` is the name shown; ``reason`` what is wrong without the path; ``hint`` what to
    do; ``saved_to`` where the bytes that could not be written were kept instead, if any.
    The ``fluid`` command exits 4 (docs/cli.md).
    """

    def __init__(self, path: str, reason: str, hint: str, *, saved_to: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.hint = hint
        self.saved_to = saved_to
        super().__init__(f"{path} {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_output_error, (self.path, self.reason, self.hint, self.saved_to))

    def to_dict(self) -> dict[str, Any]:
        """The ``error`` of ``--json``: the class, the message, the path, where data went."""
        return {
            "error": type(self).__name__,
            "message": str(self),
            "path": self.path,
            "saved_to": self.saved_to,
        }


def _rebuild_output_error(
    path: str, reason: str, hint: str, saved_to: str | None
) -> OutputPathError:
    return OutputPathError(path, reason, hint, saved_to=saved_to)


@dataclass(frozen=True, slots=True)
class OutputFile:
    """Where an output file goes, once checked.

    ``path`` is what is written: the regular file a symbolic link points to (so the
    link stays), or the path itself. ``stream`` is true for a FIFO, a character device
    (a terminal, ``/dev/null``) or a descriptor (``/dev/stdout``, ``/dev/fd/N``): those
    are opened and written into (:func:`open_output`), never replaced.
    """

    path: str
    stream: bool


# Paths that name an open descriptor of this process (what /dev/stdout resolves to).
_DESCRIPTOR_DIRS: Final = ("/proc/", "/dev/fd/")
_O_WRITE_STREAM: Final = (
    os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
)


def _names_a_descriptor(path: str) -> bool:
    """Whether ``path``, or a symbolic link on the way from it, is under /proc or /dev/fd."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on a chain of links
        if current.startswith(_DESCRIPTOR_DIRS):
            return True
        try:
            link = os.readlink(current)
        except (OSError, ValueError):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), link))
    return False


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


_WRITE_HINT: Final = "choose a path in a directory you can write"


def _unwritable(shown: str, directory: str, exc: OSError, hint: str) -> OutputPathError:
    where = directory or "."
    # ENOENT from a directory that exists: a place no file can be created in (/proc).
    if exc.errno == errno.ENOENT and not os.path.isdir(where):
        reason = f"cannot be written: {where} does not exist"
    elif exc.errno == errno.ENOTDIR:
        reason = f"cannot be written: {where} is not a directory"
    else:
        reason = f"cannot be written: no file can be created in {where} ({_why(exc)})"
    return OutputPathError(shown, reason, hint)


def _probe_file(shown: str, directory: str, hint: str) -> None:
    """Create and remove a file in ``directory``, as :func:`write_atomic` will: the real check."""
    try:
        fd, temp = tempfile.mkstemp(dir=directory or ".", prefix=".fluid-probe-", suffix=".tmp")
    except OSError as exc:
        raise _unwritable(shown, directory, exc, hint) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(temp)


def check_output_file(
    path: str | os.PathLike[str], *, name: str | None = None, hint: str = _WRITE_HINT
) -> OutputFile:
    """Check, before any work, that a file can be written at ``path``; say how to write it.

    A FIFO, a character device or a descriptor path is a stream. Anything else must be a
    regular file or nothing yet, in a directory where a file can be created (a probe file
    is created and removed there: permissions, a read-only file system, ``/proc`` are all
    found out now). Refusals are :class:`OutputPathError` with ``hint``; nothing is left
    behind.
    """
    target = os.fspath(path)
    shown = name if name is not None else target
    try:
        info: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        info = None  # nothing there yet, or a link to nothing: created as the shell would
    except OSError as exc:
        raise _unwritable(shown, os.path.dirname(target), exc, hint) from None
    if info is not None:
        if stat.S_ISFIFO(info.st_mode) or stat.S_ISCHR(info.st_mode):
            return OutputFile(target, stream=True)
        if _names_a_descriptor(target):
            return OutputFile(target, stream=True)
        if not stat.S_ISREG(info.st_mode):
            raise OutputPathError(
                shown,
                f"is {file_kind(info.st_mode)}",
                "give the path of a file, a FIFO or /dev/stdout",
            )
    # Through a symbolic link, the file it points to is replaced and the link stays.
    real = os.path.realpath(target) if os.path.islink(target) else target
    _probe_file(shown, os.path.dirname(real), hint)
    return OutputFile(real, stream=False)


def open_output(output: OutputFile) -> int:
    """A descriptor to stream into ``output`` (a FIFO, a device, a descriptor path).

    Never creates or truncates. ``/dev/stdout`` and ``/dev/stderr`` (anything that is
    this process's standard output or error) share that descriptor, as a shell
    redirection would, so what else is printed there keeps its order. Opening a FIFO
    waits for its reader, as ``> fifo`` in a shell does. The caller closes it.
    """
    try:
        info = os.stat(output.path)
    except OSError:
        info = None
    if info is not None:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                if os.path.samestat(info, os.fstat(fd)):
                    return os.dup(fd)
    return os.open(output.path, _O_WRITE_STREAM)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd`` (a pipe may take it in several writes)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def save_aside(data: bytes, *, prefix: str, suffix: str) -> str | None:
    """Keep ``data`` in a new private file (mode 0600): in the working directory, else in
    the temporary directory. Its path, or None when neither can take it."""
    for directory in (os.getcwd(), tempfile.gettempdir()):
        try:
            fd, path = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        return path
    return None


def check_output_dir(
    path: str | os.PathLike[str], *, name: str | None = None, hint: str = _WRITE_HINT
) -> None:
    """Check, before any work, that files can be written under the directory ``path``.

    An existing directory must take a probe file; a missing one must be creatable: its
    nearest existing ancestor must be a directory that takes a probe directory. Links
    are followed here; refusing them is the writer's business. Refusals are
    :class:`OutputPathError` with ``hint``; nothing is left behind.
    """
    target = os.path.normpath(os.fspath(path))
    shown = name if name is not None else os.fspath(path)
    try:
        info: os.stat_result | None = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:
        raise OutputPathError(shown, f"cannot be used ({_why(exc)})", hint) from None
    if info is not None:
        if not stat.S_ISDIR(info.st_mode):
            raise OutputPathError(shown, f"is {file_kind(info.st_mode)}, not a directory", hint)
        _probe_file(shown, target, hint)
        return
    ancestor = os.path.dirname(target) or "."
    while not os.path.lexists(ancestor) and ancestor not in (".", os.path.dirname(ancestor)):
        ancestor = os.path.dirname(ancestor) or "."
    if not os.path.isdir(ancestor):
        raise OutputPathError(shown, f"cannot be created: {ancestor} is not a directory", hint)
    try:
        probe = tempfile.mkdtemp(dir=ancestor, prefix=".fluid-probe-")
    except OSError as exc:
        reason = f"cannot be created: no directory can be made in {ancestor} ({_why(exc)})"
        raise OutputPathError(shown, reason, hint) from None
    with contextlib.suppress(OSError):
        os.rmdir(probe)
