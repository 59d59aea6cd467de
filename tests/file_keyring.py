"""A keyring backend in a file under $HOME, for `fluid` subprocesses that need an OS keyring.

Selected with ``PYTHON_KEYRING_BACKEND=tests.file_keyring.FileKeyring`` (the
repository on ``PYTHONPATH``): a command shown in the docs that stores a key
then runs as it does on a desktop, without touching the machine's keyring.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from keyring.backend import KeyringBackend


class FileKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    @property
    def _path(self) -> Path:
        return Path(os.environ["HOME"]) / "test-keyring.json"

    def _load(self) -> dict[str, str]:
        try:
            return dict(json.loads(self._path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return {}

    def get_password(self, service: str, username: str) -> str | None:
        return self._load().get(f"{service}/{username}")

    def set_password(self, service: str, username: str, password: str) -> None:
        stored = self._load()
        stored[f"{service}/{username}"] = password
        self._path.write_text(json.dumps(stored), encoding="utf-8")

    def delete_password(self, service: str, username: str) -> None:
        stored = self._load()
        stored.pop(f"{service}/{username}", None)
        self._path.write_text(json.dumps(stored), encoding="utf-8")
