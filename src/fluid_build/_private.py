"""Private state on disk: directories 0700, whatever the umask.

Shared by the configuration (``aiconfig``) and the cooldown store: both hold
things other users of the machine have no business reading (key sources,
endpoint URLs, model names, key fingerprints).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["private_dir"]


def private_dir(directory: Path) -> None:
    """Create ``directory`` and each missing parent with mode 0700 (the XDG rule).

    An existing directory is left as it is, a symbolic link to one included:
    pointing the configuration or the cache elsewhere is the owner's choice.
    """
    missing = [directory, *directory.parents]
    missing = [p for p in missing if not p.exists()]
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process
            continue
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
