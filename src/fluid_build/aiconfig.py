"""The provider, model and key that ``fluid ai setup`` stored; the environment always wins.

Where things live:

- ``ai_config.json`` in the configuration directory (directory 0700, file
  0600): the provider, the model and, per provider, where its key is. The
  directory is ``$FLUID_HOME`` when set, else ``$XDG_CONFIG_HOME/fluid``
  (``~/.config/fluid`` when ``XDG_CONFIG_HOME`` is unset or not absolute).
  A file left in ``~/.fluid`` by an older version is moved there once (see
  :func:`_move_legacy_config`).
- The key: in the OS keyring (service ``fluid_build``, user = the provider)
  when a usable backend exists; in the JSON file only with the opt-in
  ``FLUID_ALLOW_PLAINTEXT_AI_SECRETS=1``, and then read back only while that
  opt-in is still set and the file is readable by its owner alone.

A file that cannot be read, is not JSON, has the wrong shape or can be written
by others is ignored with one warning on the ``fluid_build.config`` logger;
it never fails a command. The file is read only by the functions below, never
at import. :func:`apply_stored_config` is how a command merges it in: every
variable already set in the environment is kept as it is.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fluid_build._files import (
    MAX_DEPTH,
    NotRegularFileError,
    TooDeepError,
    file_kind,
    load_json,
    open_regular,
    read_at_most,
    write_atomic,
)
from fluid_build._private import private_dir
from fluid_build._redact import redact
from fluid_build.copilot.llm import registry

if TYPE_CHECKING:
    from keyring.backend import KeyringBackend

__all__ = [
    "CONFIG_DIR_NAME",
    "CONFIG_FILE_NAME",
    "FLUID_HOME_ENV",
    "KEYRING_SERVICE",
    "LEGACY_DIR_NAME",
    "PLAINTEXT_OPT_IN_ENV",
    "XDG_CONFIG_HOME_ENV",
    "AIConfig",
    "ConfigSource",
    "KeySource",
    "apply_stored_config",
    "config_dir",
    "config_path",
    "config_source",
    "keyring_backend",
    "legacy_config_dir",
    "load_ai_config",
    "plaintext_allowed",
    "save_ai_config",
    "stored_api_key",
]

LOG = logging.getLogger("fluid_build.config")

FLUID_HOME_ENV: Final = "FLUID_HOME"
PLAINTEXT_OPT_IN_ENV: Final = "FLUID_ALLOW_PLAINTEXT_AI_SECRETS"
KEYRING_SERVICE: Final = "fluid_build"
CONFIG_FILE_NAME: Final = "ai_config.json"
XDG_CONFIG_HOME_ENV: Final = "XDG_CONFIG_HOME"
CONFIG_DIR_NAME: Final = "fluid"
#: Where older versions kept the configuration, under the home directory.
LEGACY_DIR_NAME: Final = ".fluid"
_VERSION: Final = 1


class _StoredSettings(Mapping[str, tuple[str, ...]]):
    """Each provider's ``stored_settings`` (llm/registry.py), read from its entry when asked."""

    def __getitem__(self, name: str) -> tuple[str, ...]:
        entry = registry.PROVIDERS.get(name)
        if entry is None or not entry.stored_settings:
            raise KeyError(name)
        return entry.stored_settings

    def __iter__(self) -> Iterator[str]:
        return (e.name for e in registry.PROVIDERS.values() if e.stored_settings)

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: The settings ``fluid ai setup`` stores for a cloud provider, as the variables they fill.
#: Never a credential: AWS and Google keep theirs in their own files and tools.
CLOUD_SETTINGS: Final[Mapping[str, tuple[str, ...]]] = _StoredSettings()
_SETTING_LIMIT: Final = 100
_MAX_FILE_BYTES: Final = 64 * 1024

KeySource = Literal["keyring", "file"]
ConfigSource = Literal["FLUID_HOME", "XDG_CONFIG_HOME", "default"]


class AIConfig(BaseModel):
    """What ``ai_config.json`` says, after checks. Never holds a key.

    ``key_source`` is where the stored provider's key is; ``key_sources`` the
    same for every provider with a stored key. ``problems`` says why the file
    (or part of it) was ignored.
    """

    model_config = ConfigDict(frozen=True)

    provider: str | None = None
    model: str | None = None
    key_source: KeySource | None = None
    key_sources: dict[str, KeySource] = Field(default_factory=dict)
    #: Per provider, the variables a cloud provider's stored settings fill (CLOUD_SETTINGS).
    settings: dict[str, dict[str, str]] = Field(default_factory=dict)
    path: str = ""
    exists: bool = False
    problems: tuple[str, ...] = ()


class _StoredFile(BaseModel):
    """The on-disk shape; ``keys`` holds plaintext keys only with the opt-in."""

    model_config = ConfigDict(extra="ignore", strict=True)

    version: int = _VERSION
    provider: str | None = None
    model: str | None = None
    key_sources: dict[str, KeySource] = Field(default_factory=dict)
    keys: dict[str, str] = Field(default_factory=dict)
    settings: dict[str, dict[str, str]] = Field(default_factory=dict)


def setting_problem(value: str) -> str | None:
    """Why ``value`` cannot be a region, project or location name (it is a name, never a URL)."""
    if not value or len(value) > _SETTING_LIMIT:
        return f"must be 1 to {_SETTING_LIMIT} characters"
    if not all(ch.isascii() and (ch.isalnum() or ch in "-_.") for ch in value):
        return "may hold only letters, digits, '-', '_' and '.'"
    return None


def _settings(
    stored: Mapping[str, Mapping[str, str]], warn: Callable[[str], None]
) -> dict[str, dict[str, str]]:
    """The stored cloud settings that can be used; each other one is a warning."""
    kept: dict[str, dict[str, str]] = {}
    for provider, values in stored.items():
        allowed = CLOUD_SETTINGS.get(provider, ())
        for name, value in values.items():
            problem = setting_problem(value) if name in allowed else "is not a stored setting"
            if problem is not None:
                warn(f"settings.{provider[:40]}.{name[:40]} {problem}; ignoring it")
                continue
            kept.setdefault(provider, {})[name] = value
    return kept


@dataclass(frozen=True)
class _Loaded:
    config: AIConfig
    # Plaintext keys that passed every check; kept out of AIConfig and of repr.
    file_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    raw: _StoredFile | None = field(default=None, repr=False)
    exposed: bool = False  # the file held keys while others could read it


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def _home_problem(env: Mapping[str, str]) -> str | None:
    """Why ``FLUID_HOME`` cannot name a directory, or None when it can (or is unset)."""
    base = (env.get(FLUID_HOME_ENV) or "").strip()
    if not base:
        return None
    shown = repr(base[:80])
    if not base.isprintable():
        return (
            f"{FLUID_HOME_ENV}={shown} contains control characters; no stored configuration is "
            f"read (set it to a directory, e.g. {FLUID_HOME_ENV}=~/.config/fluid)"
        )
    try:
        Path(base).expanduser()
    except RuntimeError:  # "~someone" for a user this machine does not know
        return (
            f"{FLUID_HOME_ENV}={shown} names the home of an unknown user; no stored "
            f"configuration is read (set it to a directory, e.g. {FLUID_HOME_ENV}=~/.config/fluid)"
        )
    return None


def _xdg_config_home(env: Mapping[str, str]) -> Path | None:
    # The XDG spec: a relative path in these variables is invalid and ignored.
    value = env.get(XDG_CONFIG_HOME_ENV) or ""
    return Path(value) if value and os.path.isabs(value) else None


def config_source(env: Mapping[str, str] | None = None) -> ConfigSource:
    """What chose :func:`config_dir`: ``FLUID_HOME``, ``XDG_CONFIG_HOME`` or the default."""
    env = _env(env)
    if (env.get(FLUID_HOME_ENV) or "").strip():
        return "FLUID_HOME"
    return "XDG_CONFIG_HOME" if _xdg_config_home(env) is not None else "default"


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$FLUID_HOME``, else ``$XDG_CONFIG_HOME/fluid``, else ``~/.config/fluid``."""
    env = _env(env)
    base = (env.get(FLUID_HOME_ENV) or "").strip()
    if base:
        if _home_problem(env) is not None:
            return Path(base)  # shown as it was given; never read (see _load)
        return Path(base).expanduser()
    xdg = _xdg_config_home(env)
    return (xdg if xdg is not None else Path.home() / ".config") / CONFIG_DIR_NAME


def legacy_config_dir() -> Path:
    """``~/.fluid``: where older versions kept ``ai_config.json``."""
    return Path.home() / LEGACY_DIR_NAME


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """``ai_config.json`` in :func:`config_dir`."""
    return config_dir(env) / CONFIG_FILE_NAME


_YES: Final = frozenset({"1", "true", "yes", "on"})
_NO: Final = frozenset({"", "0", "false", "no", "off"})


def plaintext_allowed(env: Mapping[str, str] | None = None) -> bool:
    """True when ``FLUID_ALLOW_PLAINTEXT_AI_SECRETS`` opts in to keys in the JSON file.

    ``1``/``true``/``yes``/``on`` (any case) opt in; anything else does not, and a
    value that is neither yes nor no logs one warning.
    """
    raw = _env(env).get(PLAINTEXT_OPT_IN_ENV) or ""
    value = raw.strip().lower()
    if value not in _YES | _NO and (PLAINTEXT_OPT_IN_ENV, raw) not in _SAID_VALUES:
        _SAID_VALUES.add((PLAINTEXT_OPT_IN_ENV, raw))
        LOG.warning(
            "%s=%r is not a yes/no value; plaintext keys stay off (to opt in: %s=1)",
            PLAINTEXT_OPT_IN_ENV,
            redact(raw)[:40],
            PLAINTEXT_OPT_IN_ENV,
        )
    return value in _YES


# What was already logged: one command may read the file several times, says it once.
_SAID: set[tuple[str, str]] = set()
_SAID_VALUES: set[tuple[str, str]] = set()


def _warn(path: Path, problem: str, problems: list[str], *, loud: bool = False) -> None:
    problems.append(problem)
    if (str(path), problem) in _SAID:
        return
    _SAID.add((str(path), problem))
    LOG.log(logging.ERROR if loud else logging.WARNING, "%s: %s", path, problem)


def _load(env: Mapping[str, str]) -> _Loaded:
    path = config_path(env)
    problems: list[str] = []
    if config_source(env) != "FLUID_HOME":
        _move_legacy_config(path)

    def ignored(problem: str) -> _Loaded:
        _warn(path, f"{problem}; ignoring this file (run `fluid ai setup` to rewrite it)", problems)
        return _Loaded(AIConfig(path=str(path), exists=True, problems=tuple(problems)))

    home_problem = _home_problem(env)
    if home_problem is not None:
        problems.append(home_problem)
        if (FLUID_HOME_ENV, home_problem) not in _SAID:
            _SAID.add((FLUID_HOME_ENV, home_problem))
            LOG.warning("%s", home_problem)
        return _Loaded(AIConfig(path=str(path), problems=tuple(problems)))
    try:
        # Opened without blocking and checked before any read: a FIFO or a device
        # planted at the path is refused, never waited on.
        fd = open_regular(path)
    except FileNotFoundError:
        return _Loaded(AIConfig(path=str(path)))
    except NotRegularFileError as exc:
        return ignored(f"is not a regular file (it is {exc.kind})")
    except (OSError, ValueError) as exc:  # ValueError: a path the OS cannot take
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return ignored(f"cannot be read ({type(exc).__name__}: {detail})")
    try:
        info = os.fstat(fd)
        data = read_at_most(fd, _MAX_FILE_BYTES + 1)
    except OSError as exc:
        return ignored(f"cannot be read ({type(exc).__name__}: {exc.strerror or exc})")
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE_BYTES:
        return ignored(f"is larger than {_MAX_FILE_BYTES} bytes")
    posix = os.name == "posix"
    if posix and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return ignored(
            f"can be written by other users (mode {stat.S_IMODE(info.st_mode):04o}, should be 0600)"
        )
    try:
        parsed = load_json(data.decode("utf-8"), name=str(path))
    except TooDeepError:
        return ignored(f"is nested deeper than {MAX_DEPTH} levels")
    except (UnicodeDecodeError, ValueError) as exc:
        # The position only: the message of a JSON error can quote the file's text.
        where = f" at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        return ignored(f"is not valid JSON{where}")
    try:
        stored = _StoredFile.model_validate(parsed)
    except ValidationError as exc:
        fields = sorted({".".join(str(p) for p in e["loc"]) or "(top level)" for e in exc.errors()})
        return ignored(f"has values of the wrong type ({', '.join(fields)})")
    if stored.version != _VERSION:
        return ignored(f"has version {stored.version}; this fluid_build reads version {_VERSION}")

    from fluid_build.copilot.llm.settings import PROVIDERS

    provider = stored.provider.strip().lower() if stored.provider else None
    if provider is not None and provider not in PROVIDERS:
        _warn(path, f"names an unknown provider {provider!r}; ignoring it", problems)
        provider = None
    model = stored.model.strip() if stored.model and stored.model.strip() else None
    if provider is None:
        model = None
    sources = {p: s for p, s in stored.key_sources.items() if p in PROVIDERS}

    keys: dict[str, str] = {}
    exposed = bool(stored.keys) and posix and bool(info.st_mode & (stat.S_IRGRP | stat.S_IROTH))
    if stored.keys:
        if exposed:
            _warn(
                path,
                f"holds API keys but other users can read it (mode "
                f"{stat.S_IMODE(info.st_mode):04o}): its keys are NOT used. Treat them as "
                f"leaked: revoke them, then `chmod 600 {path}` and run `fluid ai setup` again",
                problems,
                loud=True,
            )
        elif not plaintext_allowed(env):
            _warn(
                path,
                f"holds plaintext API keys but {PLAINTEXT_OPT_IN_ENV}=1 is not set: they are "
                "not used",
                problems,
            )
        else:
            keys = {p: k for p, k in stored.keys.items() if p in PROVIDERS and k}
    elif posix and info.st_mode & stat.S_IROTH:
        _warn(
            path,
            f"is readable by every user (mode {stat.S_IMODE(info.st_mode):04o}); it holds no "
            f"key, so it is used, but `chmod 600 {path}` keeps it private",
            problems,
        )
    sources = {p: s for p, s in sources.items() if s == "keyring" or p in keys}
    settings = _settings(stored.settings, lambda problem: _warn(path, problem, problems))
    config = AIConfig(
        provider=provider,
        model=model,
        key_source=sources.get(provider) if provider else None,
        key_sources=sources,
        settings=settings,
        path=str(path),
        exists=True,
        problems=tuple(problems),
    )
    return _Loaded(config, keys, stored, exposed)


def load_ai_config(env: Mapping[str, str] | None = None) -> AIConfig:
    """The stored configuration; an empty one when there is none or it is unusable."""
    return _load(_env(env)).config


# -- the keyring ------------------------------------------------------------------


def keyring_backend() -> KeyringBackend | None:
    """The OS keyring's backend, or None when there is no usable one (or no ``keyring``)."""
    try:
        import keyring
        from keyring.backends import chainer, fail, null
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
    except Exception as exc:  # noqa: BLE001 - a broken keyring setup means "no keyring"
        LOG.warning("the OS keyring cannot be used (%s: %s)", type(exc).__name__, exc)
        return None
    if isinstance(backend, fail.Keyring | null.Keyring):
        return None
    if isinstance(backend, chainer.ChainerBackend) and not backend.backends:
        return None
    return backend


def _keyring_get(provider: str) -> str | None:
    backend = keyring_backend()
    if backend is None:
        return None
    try:
        value = backend.get_password(KEYRING_SERVICE, provider)
    except Exception as exc:  # noqa: BLE001 - e.g. a locked keychain: fall through, warned
        LOG.warning("cannot read the %s key from the OS keyring (%s)", provider, type(exc).__name__)
        return None
    return value.strip() if value and value.strip() else None


def _stored_key(loaded: _Loaded, provider: str) -> str | None:
    # The keyring is asked only for a key setup put there: a machine that never
    # ran `fluid ai setup` never sees a keyring prompt.
    if loaded.config.key_sources.get(provider) == "keyring":
        key = _keyring_get(provider)
        if key:
            return key
    return loaded.file_keys.get(provider)


def stored_api_key(provider: str, env: Mapping[str, str] | None = None) -> str | None:
    """The key ``fluid ai setup`` stored for ``provider``: keyring first, then the file.

    The file's key is returned only while ``FLUID_ALLOW_PLAINTEXT_AI_SECRETS=1``
    is set and the file is private to its owner.
    """
    return _stored_key(_load(_env(env)), provider.lower())


def apply_stored_config(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` plus the stored provider, model and key, each only where ``env`` has none.

    ``FLUID_LLM_PROVIDER`` is filled from the stored provider; ``FLUID_LLM_MODEL``
    from the stored model when the provider in effect is the stored one; the
    provider's own key variable (e.g. ``OPENAI_API_KEY``) from the stored key
    when neither it nor ``FLUID_LLM_API_KEY`` is set. ``env`` is not changed.
    """
    from fluid_build.copilot.llm.settings import PROVIDERS

    out = dict(env)
    loaded = _load(env)
    config = loaded.config

    def unset(name: str) -> bool:
        return not (out.get(name) or "").strip()

    if config.provider and unset("FLUID_LLM_PROVIDER"):
        out["FLUID_LLM_PROVIDER"] = config.provider
    provider = (out.get("FLUID_LLM_PROVIDER") or "").strip().lower()
    info = PROVIDERS.get(provider)
    if info is None:
        return out
    if config.model and provider == config.provider and unset("FLUID_LLM_MODEL"):
        out["FLUID_LLM_MODEL"] = config.model
    for name, value in config.settings.get(provider, {}).items():
        if unset(name):
            out[name] = value
    if info.key_vars and unset("FLUID_LLM_API_KEY") and all(unset(v) for v in info.key_vars):
        key = _stored_key(loaded, provider)
        if key:
            out[info.key_vars[0]] = key
    return out


# -- writing ----------------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, mode 0600, in a 0700 directory."""
    directory = path.parent
    private_dir(directory)
    write_atomic(path, text.encode("utf-8"))  # 0600 from mkstemp, before the rename


def save_ai_config(
    provider: str,
    *,
    model: str | None,
    key_source: KeySource | None = None,
    key: str | None = None,
    env: Mapping[str, str] | None = None,
    settings: Mapping[str, str] | None = None,
) -> AIConfig:
    """Store ``provider`` (and ``model``); record where its key is.

    ``key`` is written to the file only with ``key_source="file"``; with
    ``"keyring"`` the caller has already stored it there, and any plaintext
    copy of that provider's key is removed. Keys of other providers are kept.
    ``settings`` (CLOUD_SETTINGS' variables) replace that provider's stored settings;
    None keeps them. Other providers' settings are kept.
    """
    env = _env(env)
    if key_source == "file" and not key:
        raise ValueError("key_source='file' needs the key")
    loaded = _load(env)
    previous = loaded.raw
    sources: dict[str, Any] = dict(previous.key_sources) if previous else {}
    # Keys that sat in a file others could read are dropped, not rewritten.
    keys: dict[str, str] = dict(previous.keys) if previous and not loaded.exposed else {}
    if loaded.exposed:
        sources = {p: s for p, s in sources.items() if s != "file"}
    if key_source is not None:
        sources[provider] = key_source
        keys.pop(provider, None)
        if key_source == "file" and key:
            keys[provider] = key
    document = {
        "version": _VERSION,
        "provider": provider,
        "model": model,
        "key_sources": dict(sorted(sources.items())),
    }
    if keys:
        document["keys"] = dict(sorted(keys.items()))
    kept = dict(loaded.config.settings)
    if settings is not None:
        allowed = CLOUD_SETTINGS.get(provider, ())
        bad = [name for name in settings if name not in allowed]
        if bad:
            raise ValueError(f"{provider} has no stored setting {bad[0]!r}")
        kept[provider] = dict(settings)
    kept = {p: dict(sorted(v.items())) for p, v in sorted(kept.items()) if v}
    if kept:
        document["settings"] = kept
    _write_private(config_path(env), json.dumps(document, indent=2) + "\n")
    return _load(env).config


# -- moving ~/.fluid --------------------------------------------------------------

_SAID_MOVES: set[str] = set()


def _say_once(text: str) -> None:
    if text not in _SAID_MOVES:
        _SAID_MOVES.add(text)
        LOG.warning("%s", text)


def _move_legacy_config(target: Path) -> None:
    """Move ``~/.fluid/ai_config.json`` to ``target`` once, when it is safe to.

    The rules: only ``ai_config.json`` moves (``~/.fluid`` may hold another
    program's files); never through a symbolic link (neither ``~/.fluid`` nor
    the file may be one: they are named, not followed); never over a file at
    ``target`` (an existing new configuration wins, and the old file is left
    with a warning); atomic (a hard link, then the old name removed, so a
    reader sees the whole file at one name or the other; across file systems
    a private copy is linked into place the same way); the file keeps its
    inode and mode, so the checks of :func:`_load` apply to it as before.
    ``~/.fluid`` is removed when nothing else is left in it. Each outcome is
    logged once; the common case, nothing to move, costs one ``lstat``.
    """
    try:
        legacy = legacy_config_dir()
        top = os.lstat(legacy)
    except (OSError, RuntimeError):  # no ~/.fluid (or no home at all): nothing to do
        return
    source = legacy / CONFIG_FILE_NAME
    keep_using = f"or set {FLUID_HOME_ENV}={legacy} to keep using it there"
    if stat.S_ISLNK(top.st_mode):
        with contextlib.suppress(OSError):
            if not os.path.lexists(source) or os.path.lexists(target):
                return
            _say_once(
                f"{legacy} is a symbolic link, which fluid does not move files through; "
                f"fluid now reads {target}: move {source} there yourself, {keep_using}"
            )
        return
    if not stat.S_ISDIR(top.st_mode):
        return
    try:
        info = os.lstat(source)
    except FileNotFoundError:
        return
    except OSError as exc:
        _say_once(f"{source} cannot be moved to {target} ({type(exc).__name__}); {keep_using}")
        return
    if not stat.S_ISREG(info.st_mode):
        _say_once(
            f"{source} is {file_kind(info.st_mode)}, not a regular file; it was not moved to "
            f"{target}: move it yourself, {keep_using}"
        )
        return
    if _moved_already(source, info, target):
        return
    try:
        private_dir(target.parent)
        moved = _link_into_place(source, info, target)
    except OSError as exc:
        _say_once(
            f"{source} could not be moved to {target} ({type(exc).__name__}: "
            f"{exc.strerror or exc}); {keep_using}"
        )
        return
    if not moved:
        _moved_already(source, info, target)
        return
    with contextlib.suppress(OSError):
        os.unlink(source)
    removed = False
    with contextlib.suppress(OSError):
        os.rmdir(legacy)  # only when empty: anything else in it stays
        removed = True
    LOG.warning(
        "moved %s to %s, where fluid keeps its configuration now (XDG_CONFIG_HOME)%s",
        source,
        target,
        f"; removed the empty {legacy}" if removed else "",
    )


def _moved_already(source: Path, info: os.stat_result, target: Path) -> bool:
    """True when ``target`` exists: the same file (another process is moving it), or a
    newer configuration, which wins; the old file is then left, with a warning."""
    try:
        there = os.lstat(target)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    if os.path.samestat(there, info):
        with contextlib.suppress(OSError):
            os.unlink(source)
        return True
    _say_once(
        f"{source} is not used: {target} exists and wins. Remove the old file once you "
        f"have checked it (or set {FLUID_HOME_ENV}={source.parent} to use it instead)"
    )
    return True


# link() failing with these means "not here", not "not allowed": copy instead.
_NO_HARD_LINK: Final = frozenset(
    {errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}
)


def _link_into_place(source: Path, info: os.stat_result, target: Path) -> bool:
    """Give ``source``'s file the name ``target`` without replacing anything there.

    False when ``target`` appeared meanwhile. A hard link where possible; else
    (another file system) a copy with the same mode, written and synced under a
    temporary name first, then linked to ``target``.
    """
    try:
        os.link(source, target, follow_symlinks=False)
    except FileExistsError:
        return False
    except NotImplementedError:  # no linkat(): the copy below opens without following
        pass
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINK:
            raise
    else:
        if os.path.samestat(os.lstat(target), info):
            return True
        os.unlink(target)  # swapped between the checks: undo, move nothing
        return False
    fd = open_regular(source, follow_symlinks=False)
    try:
        if not os.path.samestat(os.fstat(fd), info):
            return False
        data = read_at_most(fd, _MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE_BYTES:
        raise OSError(errno.EFBIG, f"larger than {_MAX_FILE_BYTES} bytes")
    temp_fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(temp_fd, "wb") as handle:
            if hasattr(os, "fchmod"):
                os.fchmod(handle.fileno(), stat.S_IMODE(info.st_mode))
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temp, target)
        except FileExistsError:
            return False
        except OSError:
            # No hard links on this file system: the one step that is not
            # atomic against a file created in the instant between these two.
            if os.path.lexists(target):
                return False
            os.replace(temp, target)
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
