"""The tools `fluid forge --agent-loop` offers the model, all confined to the workspace."""

from __future__ import annotations

from typing import Final

from fluid_build.copilot.agents.tools import Tool, WorkspacePath, forge_tool

__all__ = ["TEMPLATES", "workspace_tools"]

_READABLE: Final = frozenset({".json", ".yaml", ".yml", ".sql", ".csv", ".md", ".txt"})
_SKIP_DIRS: Final = frozenset({".git", ".fluid", "node_modules", "__pycache__", ".venv"})

#: Modeling templates the generate stage may follow.
TEMPLATES: Final = {
    "dimensional": "Star schema: a fact table at the grain, conformed dimensions, surrogate keys.",
    "data_vault": "Hubs for business keys, links for relationships, satellites for history.",
    "one_big_table": "One wide denormalised table at the grain, dimensions flattened in.",
    "activity_schema": "One activity stream table: entity, activity, timestamp, features.",
}


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
    root = directory
    found: list[str] = []
    for path in sorted(root.rglob("*")):
        if any(part in _SKIP_DIRS for part in path.relative_to(root).parts):
            continue
        if path.is_file() and not path.is_symlink():
            found.append(str(path.relative_to(root)))
            if len(found) >= max_entries:
                break
    return found


@forge_tool(read_only=True, timeout=10)
def read_sample_schema(path: WorkspacePath, max_chars: int = 20_000) -> str:
    """Read a schema, SQL, YAML, JSON, CSV or Markdown file from the workspace.

    Args:
        path: The file, relative to the workspace.
        max_chars: The most characters to return.
    """
    if path.suffix.lower() not in _READABLE:
        raise ValueError(f"{path.suffix or 'this'} files are not readable here")
    return path.read_text(encoding="utf-8", errors="replace")[:max_chars]


@forge_tool(read_only=True, timeout=5)
def list_templates() -> dict[str, str]:
    """List the modeling templates and what each one prescribes."""
    return dict(TEMPLATES)


def workspace_tools() -> list[Tool]:
    return [discover_workspace, read_sample_schema, list_templates]
