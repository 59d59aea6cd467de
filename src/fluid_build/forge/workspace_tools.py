"""The tools `fluid forge --agent-loop` offers the model, all confined to the workspace."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Final

from pydantic import Field

from fluid_build._files import read_text_head
from fluid_build.copilot.agents.errors import ToolValidationError
from fluid_build.copilot.loop.declare import Tool, forge_tool
from fluid_build.copilot.loop.workspace import Workspace, WorkspacePath, current_workspace

__all__ = ["MAX_SAMPLE_CHARS", "MAX_WALK_DEPTH", "TEMPLATES", "workspace_tools"]

#: The most characters ``read_sample_schema`` returns; it reads at most 4 bytes per character.
MAX_SAMPLE_CHARS: Final = 1_000_000
#: How deep ``discover_workspace`` descends below the folder it lists.
MAX_WALK_DEPTH: Final = 32

_READABLE: Final = frozenset({".json", ".yaml", ".yml", ".sql", ".csv", ".md", ".txt"})
_SKIP_DIRS: Final = frozenset({".git", ".fluid", "node_modules", "__pycache__", ".venv"})

#: Modeling templates the generate stage may follow.
TEMPLATES: Final = {
    "dimensional": "Star schema: a fact table at the grain, conformed dimensions, surrogate keys.",
    "data_vault": "Hubs for business keys, links for relationships, satellites for history.",
    "one_big_table": "One wide denormalised table at the grain, dimensions flattened in.",
    "activity_schema": "One activity stream table: entity, activity, timestamp, features.",
}


def _entries(fd: int) -> list[tuple[str, bool]]:
    """The regular files and directories in the open directory ``fd``, sorted; never symlinks."""
    found: list[tuple[str, bool]] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:  # removed while listing
                continue
            if stat.S_ISDIR(mode):
                found.append((entry.name, True))
            elif stat.S_ISREG(mode):
                found.append((entry.name, False))
    return sorted(found)


def _walk(workspace: Workspace, fd: int, prefix: tuple[str, ...]) -> Iterator[str]:
    """Regular files below the open directory ``fd``, in path order, opened without following
    symlinks (a directory swapped for a symlink mid-walk is skipped, not followed)."""
    for name, is_dir in _entries(fd):
        if not is_dir:
            yield "/".join((*prefix, name))
            continue
        if name in _SKIP_DIRS or len(prefix) >= MAX_WALK_DEPTH:
            continue
        try:
            child = workspace.open_at(fd, name, directory=True)
        except (OSError, ToolValidationError):  # gone, swapped for a symlink, unreadable
            continue
        try:
            yield from _walk(workspace, child, (*prefix, name))
        finally:
            os.close(child)


def _not_found(shown: str, kind: str) -> ToolValidationError:
    reason = f"the workspace has no {kind} {shown}: call discover_workspace to list its files"
    return ToolValidationError(reason, reason=reason)


@forge_tool(read_only=True, timeout=10)
def discover_workspace(
    directory: WorkspacePath = ".",  # type: ignore[assignment]  # validated into a Path
    max_entries: int = 200,
) -> list[str]:
    """List the files of the workspace (relative paths), to find existing schemas and SQL.

    Args:
        directory: A folder inside the workspace to list (default: its root).
        max_entries: The most paths to return.
    """
    workspace = current_workspace()
    try:
        fd = workspace.open(directory, directory=True)
    except (FileNotFoundError, NotADirectoryError):
        raise _not_found(workspace.relative(directory), "folder") from None
    found: list[str] = []
    try:
        for relative in _walk(workspace, fd, ()):
            if len(found) >= max_entries:
                break
            found.append(relative)
    finally:
        os.close(fd)
    return found


@forge_tool(read_only=True, timeout=10)
def read_sample_schema(
    path: WorkspacePath,
    max_chars: Annotated[int, Field(ge=1, le=MAX_SAMPLE_CHARS)] = 20_000,
) -> str:
    """Read a schema, SQL, YAML, JSON, CSV or Markdown file from the workspace.

    Args:
        path: The file, relative to the workspace.
        max_chars: The most characters to return.
    """
    if Path(path).suffix.lower() not in _READABLE:
        raise ValueError(f"{path.suffix or 'this'} files are not readable here")
    workspace = current_workspace()
    try:
        fd = workspace.open(path)
    except (FileNotFoundError, NotADirectoryError):
        # The model's own guess at a name: a correction it can act on, not a crash to log.
        raise _not_found(workspace.relative(path), "file") from None
    try:
        return read_text_head(fd, max_chars)
    finally:
        os.close(fd)


@forge_tool(read_only=True, timeout=5)
def list_templates() -> dict[str, str]:
    """List the modeling templates and what each one prescribes."""
    return dict(TEMPLATES)


def workspace_tools() -> list[Tool]:
    return [discover_workspace, read_sample_schema, list_templates]
