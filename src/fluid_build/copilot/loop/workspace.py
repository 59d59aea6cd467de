"""Workspace confinement: the directory a tool's ``WorkspacePath`` arguments stay inside.

A :class:`Workspace` resolves a relative path and refuses one that leads
outside its root (``tool.workspace_violation``), and opens a path so that a
symlink swapped in after the check cannot lead outside either.
``WorkspacePath`` is the parameter type that confines an argument while it
is validated; :func:`current_workspace` is the workspace of the tool call
running now. See docs/tools.md, "WorkspacePath and confinement".
"""

from __future__ import annotations

import contextvars
import errno
import os
import re
import stat
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Final, TypeAlias

from pydantic import BaseModel, PlainValidator, ValidationInfo, WithJsonSchema
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from fluid_build._files import NotRegularFileError, open_regular
from fluid_build.copilot.agents.errors import ToolValidationError

__all__ = [
    "WORKSPACE_KEY",
    "Workspace",
    "WorkspacePath",
    "context_with",
    "current_workspace",
    "mentions_workspace",
]

_DRIVE: Final = re.compile(r"[A-Za-z]:")
_ESCAPE: Final = "path escapes the workspace"


def _lexical_violation(relative: str) -> str | None:
    """Why ``relative`` can never name a file inside a root, judged on the text alone."""
    if not relative:
        return "the path is empty"
    if "\x00" in relative:
        return "the path contains a NUL byte"
    text = relative.replace("\\", "/")
    if text.startswith("/"):
        return "absolute paths are not allowed"
    if _DRIVE.match(text):
        return "drive letters are not allowed"
    parts = text.split("/")
    if parts[0].startswith("~"):
        return "home-directory paths are not allowed"
    if ".." in parts:
        return "'..' segments are not allowed"
    return None


def _violation(why: str) -> ToolValidationError:
    # The reason names the rule only: never the path, the root or $HOME.
    reason = f"{_ESCAPE}: {why}"
    return ToolValidationError(reason, code="tool.workspace_violation", reason=reason)


_O_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
#: Whether this platform can open relative to a directory descriptor without
#: following symlinks (``openat`` with ``O_NOFOLLOW``): every POSIX system.
_HAVE_OPENAT: Final = bool(_O_DIRECTORY and _O_NOFOLLOW) and os.open in os.supports_dir_fd
_SWAPPED: Final = "a symbolic link appeared on the path after it was checked"


class Workspace:
    """The directory that ``WorkspacePath`` arguments are confined to.

    ``root`` is resolved (symlinks included) once, here. Backslashes in a
    relative path are read as separators, so ``src\\main.py`` means
    ``src/main.py`` on every platform.

    :meth:`resolve` checks a path's text and where it leads now; :meth:`open`
    opens it so that nothing changed on disk since can lead it outside (see
    docs/tools.md).
    """

    __slots__ = ("_identity", "root")

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        resolved = Path(os.path.realpath(os.fspath(root)))
        if not resolved.is_dir():
            raise NotADirectoryError(f"workspace root is not a directory: {resolved}")
        self.root = resolved
        info = os.stat(resolved)
        self._identity = (info.st_dev, info.st_ino)

    def __repr__(self) -> str:
        return f"Workspace({str(self.root)!r})"

    def resolve(self, relative: str) -> Path:
        """The real path ``relative`` names inside the root.

        Refused with ``tool.workspace_violation``: empty strings, NUL bytes,
        absolute paths, drive letters and UNC names, ``~``, any ``..`` segment,
        and symlinks anywhere along the path that lead outside the root. A path
        that does not exist yet is fine when its existing part stays inside.
        """
        why = _lexical_violation(relative)
        if why is not None:
            raise _violation(why)
        try:
            os.fsencode(relative)
            real = Path(os.path.realpath(os.path.join(self.root, relative.replace("\\", "/"))))
        except (UnicodeError, ValueError, OSError):
            raise _violation("the path cannot be represented on this filesystem") from None
        if not real.is_relative_to(self.root):
            raise _violation("a symbolic link leads outside the workspace")
        return real

    # -- opening without following symlinks -----------------------------------

    def _parts(self, path: str | os.PathLike[str]) -> list[str]:
        """The components of ``path`` below the root: a relative string, or a resolved path."""
        if isinstance(path, str):
            why = _lexical_violation(path)
            if why is not None:
                raise _violation(why)
            text = path.replace("\\", "/")
        else:
            full = Path(os.fspath(path))
            if not full.is_relative_to(self.root):
                raise _violation("the path is not inside the workspace")
            text = full.relative_to(self.root).as_posix()
        parts = [part for part in text.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise _violation("'..' segments are not allowed")
        return parts

    def relative(self, path: str | os.PathLike[str]) -> str:
        """How ``path`` (relative, or a resolved path inside the root) reads from the root."""
        return "/".join(self._parts(path)) or "."

    def _open_root(self) -> int:
        fd = os.open(self.root, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != self._identity:
            os.close(fd)
            raise _violation("the workspace root was replaced")
        return fd

    def open_at(self, dir_fd: int, name: str, *, directory: bool = False, shown: str = "") -> int:
        """Open one entry ``name`` of the open directory ``dir_fd``, never following a symlink.

        ``directory=True`` opens a directory (for ``os.scandir`` or the next
        step of a walk); otherwise a regular file, opened without blocking
        (a FIFO, device, socket or directory is a ``NotRegularFileError``).
        A symlink is refused with ``tool.workspace_violation``.
        """
        if not name or name in (".", "..") or "/" in name or "\x00" in name:
            raise _violation("not a single path component")
        try:
            if directory:
                return os.open(
                    name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dir_fd
                )
            return open_regular(name, name=shown or name, dir_fd=dir_fd, follow_symlinks=False)
        except NotRegularFileError as exc:
            if exc.kind == "a symbolic link":
                raise _violation(_SWAPPED) from None
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                try:
                    mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
                except OSError:
                    raise exc from None
                if stat.S_ISLNK(mode):
                    raise _violation(_SWAPPED) from None
            raise

    def open(self, path: str | os.PathLike[str], *, directory: bool = False) -> int:
        """A read-only descriptor on ``path``, opened so that it cannot lead outside the root.

        ``path`` is relative to the root, or a path :meth:`resolve` returned.
        From a descriptor on the root (checked to be the same directory as
        when the workspace was built), each component is opened with
        ``O_NOFOLLOW`` relative to the one before. Symlinks are not followed:
        a path :meth:`resolve` returned has none, so one met here was swapped
        in after the check, and is refused with ``tool.workspace_violation``.
        A file must be a regular file, opened without blocking. The caller
        closes the descriptor.
        """
        parts = self._parts(path)
        shown = "/".join(parts) or "."
        if not _HAVE_OPENAT:
            return self._open_and_verify(parts, shown, directory=directory)
        if not parts and not directory:
            raise NotRegularFileError(".", "a directory")
        fd = self._open_root()
        try:
            for index, name in enumerate(parts):
                last = index == len(parts) - 1
                step = self.open_at(fd, name, directory=directory or not last, shown=shown)
                os.close(fd)
                fd = step
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_and_verify(self, parts: list[str], shown: str, *, directory: bool) -> int:
        """Where ``openat`` is missing: open, then check the real path of what was opened."""
        full = os.path.join(self.root, *parts)
        if directory:
            fd = os.open(full, os.O_RDONLY | _O_CLOEXEC)
        else:
            fd = open_regular(full, name=shown)
        try:
            real = os.path.realpath(full)
            if not Path(real).is_relative_to(self.root) or not os.path.samestat(
                os.fstat(fd), os.stat(real)
            ):
                raise _violation(_SWAPPED)
        except BaseException:
            os.close(fd)
            raise
        return fd


_CURRENT: Final[contextvars.ContextVar[Workspace | None]] = contextvars.ContextVar(
    "fluid_build.current_workspace", default=None
)


def current_workspace() -> Workspace:
    """The workspace of the registry running the current tool call.

    Inside a tool body this is the ``Workspace`` its ``WorkspacePath``
    arguments were confined to: open them with ``current_workspace().open(path)``
    so a symlink swapped in after validation cannot lead outside.
    """
    workspace = _CURRENT.get()
    if workspace is None:
        raise RuntimeError("no workspace: current_workspace() works inside a tool call only")
    return workspace


def context_with(workspace: Workspace | None) -> contextvars.Context:
    """A copy of the caller's context in which :func:`current_workspace` is ``workspace``."""
    context = contextvars.copy_context()
    context.run(_CURRENT.set, workspace)
    return context


#: Where a registry puts its workspace in the context that validates a tool's arguments.
WORKSPACE_KEY: Final = "fluid_build.workspace"


def _confine(value: object, info: ValidationInfo) -> Path:
    if not isinstance(value, str):
        raise PydanticCustomError("string_type", "Input should be a valid string")
    context = info.context if isinstance(info.context, Mapping) else {}
    workspace = context.get(WORKSPACE_KEY)
    if not isinstance(workspace, Workspace):
        raise PydanticCustomError("workspace_violation", "no workspace is configured")
    try:
        return workspace.resolve(value)
    except ToolValidationError as exc:
        raise PydanticCustomError("workspace_violation", exc.reason) from None


_CONFINE: Final = PlainValidator(_confine, json_schema_input_type=str)

#: A tool parameter naming a path inside the workspace. The model sends a
#: relative string; the body receives the resolved, confined ``Path``.
WorkspacePath: TypeAlias = Annotated[
    Path,
    _CONFINE,
    WithJsonSchema({"type": "string", "description": "A path relative to the workspace root."}),
]


def mentions_workspace(item: object, seen: set[int]) -> bool:
    """Whether a type, field or model takes a ``WorkspacePath`` anywhere inside."""
    if item is _CONFINE:
        return True
    if isinstance(item, FieldInfo):
        return mentions_workspace(item.annotation, seen) or any(
            mentions_workspace(m, seen) for m in item.metadata
        )
    if isinstance(item, type) and issubclass(item, BaseModel):
        if id(item) in seen:
            return False
        seen.add(id(item))
        return any(mentions_workspace(f, seen) for f in item.model_fields.values())
    return any(mentions_workspace(arg, seen) for arg in typing.get_args(item))
