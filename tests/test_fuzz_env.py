"""Property tests: whatever the environment holds, reading it gives a value or a typed error.

Each ``from_env``-style reader gets arbitrary values (numbers in every
spelling, garbage, control characters, keys pasted with a newline) and must
answer with a bounded value, the documented default or a documented typed
error, never anything else, and never echo an API key. The classifier, the
Retry-After parsers, the strict-schema walker and tool arguments have their
own properties elsewhere (docs/chaos-and-fuzzing.md lists them).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import string
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import keyring
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from keyring.backend import KeyringBackend

from fluid_build.aiconfig import CLOUD_SETTINGS, apply_stored_config, setting_problem
from fluid_build.config import env_float, env_int
from fluid_build.copilot import LLMClient
from fluid_build.copilot.agents.errors import ProviderAuthError, ProviderError
from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
from fluid_build.copilot.health.cooldown import (
    CooldownStore,
    ResilientCooldownStore,
    SqliteCooldownStore,
    cooldown_store_from_env,
    cooldown_store_from_url,
)
from fluid_build.copilot.llm.base import ProviderConfig
from fluid_build.copilot.llm.settings import PROVIDERS, resolve_provider_config
from fluid_build.copilot.loop.agent import LoopSettings
from fluid_build.errors import FluidError
from tests.loopback import closed_port

NAME = "FLUID_FUZZ_VALUE"


SLOW = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def config_log() -> Iterator[list[logging.LogRecord]]:
    """The records the ``fluid_build.config`` logger emits inside the block."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("fluid_build.config")
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# -- values as people type them ----------------------------------------------------------

padding = st.sampled_from(["", " ", "  ", "\t", "\n", " \r\n"])


@st.composite
def padded(draw: st.DrawFn, text: st.SearchStrategy[str]) -> str:
    return draw(padding) + draw(text) + draw(padding)


int_spellings = st.integers(min_value=-(10**30), max_value=10**30).map(str)
float_spellings = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=-1e6, max_value=1e6).map(lambda f: f"{f:.3f}"),
    st.integers(-400, 400).map(lambda e: f"1e{e}"),
)
odd_spellings = st.sampled_from(
    [
        "",
        " ",
        "inf",
        "-inf",
        "nan",
        "NaN",
        "Infinity",
        "1e309",
        "-0",
        "+7",
        "0x10",
        "1_000",
        "1,5",
        "٣",  # an Arabic-Indic digit: int() accepts it
        "\uff11\uff12",  # full-width digits
        "3 4",
        "true",
        "None",
        "\x00",
        "12abc",
    ]
)
any_text = st.text(max_size=30)
env_values = st.one_of(
    padded(int_spellings), padded(float_spellings), odd_spellings, any_text, st.none()
)


def env_with(**values: str | None) -> dict[str, str]:
    return {k: v for k, v in values.items() if v is not None}


@st.composite
def bounds_int(draw: st.DrawFn) -> tuple[int, int, int]:
    low = draw(st.integers(-1000, 1000))
    high = draw(st.integers(low, low + 10_000))
    return low, high, draw(st.integers(low, high))


@given(raw=env_values, limits=bounds_int())
def test_env_int_is_the_value_clamped_or_the_default(
    raw: str | None, limits: tuple[int, int, int]
) -> None:
    low, high, default = limits
    with config_log() as records:
        got = env_int(env_with(**{NAME: raw}), NAME, default, minimum=low, maximum=high)
    assert type(got) is int
    assert low <= got <= high
    try:
        parsed: int | None = int(raw.strip()) if raw is not None and raw.strip() else None
    except ValueError:
        parsed = None
    if parsed is None:
        assert got == default
    else:
        assert got == min(max(parsed, low), high)
    # Silent when the value was unset or fine; otherwise one warning naming the variable.
    quiet = raw is None or not raw.strip() or got == parsed
    assert len(records) == (0 if quiet else 1)
    assert all(NAME in r.getMessage() for r in records)


@st.composite
def bounds_float(draw: st.DrawFn) -> tuple[float, float, float | None]:
    low = draw(st.floats(-1e6, 1e6))
    high = draw(st.floats(low, low + 1e7))
    default = draw(st.one_of(st.none(), st.floats(low, high)))
    return low, high, default


@given(raw=env_values, limits=bounds_float())
def test_env_float_is_finite_and_in_bounds_or_the_default(
    raw: str | None, limits: tuple[float, float, float | None]
) -> None:
    low, high, default = limits
    with config_log() as records:
        got = env_float(env_with(**{NAME: raw}), NAME, default, minimum=low, maximum=high)
    if got is None:
        assert default is None
    else:
        assert math.isfinite(got)
        assert low <= got <= high or got == default
    assert len(records) <= 1


secret_bodies = st.text("0123456789abcdef", min_size=24, max_size=40)
key_prefixes = st.sampled_from(["", "sk-", "sk-proj-", "sk-ant-api03-", "AIza", "gsk_"])


@given(
    body=secret_bodies,
    prefix=key_prefixes.filter(bool),
    junk=st.sampled_from(["", " x", "garbage", "\n"]),
)
def test_a_key_pasted_into_a_number_is_never_logged(body: str, prefix: str, junk: str) -> None:
    # FLUID_LLM_TIMEOUT_SECONDS=sk-... (a paste into the wrong variable) warns without the key.
    # Only keys of a known shape: a bare hex string cannot be told from any other value.
    with config_log() as records:
        env_float({NAME: f"{prefix}{body}{junk}"}, NAME, 1.0, minimum=0.0, maximum=2.0)
        env_int({NAME: f"{prefix}{body}{junk}"}, NAME, 1, minimum=0, maximum=2)
    assert len(records) == 2
    for record in records:
        assert body[:20] not in record.getMessage()


# -- the factories ----------------------------------------------------------------------


@given(attempts=env_values, deadline=env_values)
def test_retry_policy_from_env_is_always_a_valid_policy(
    attempts: str | None, deadline: str | None
) -> None:
    env = env_with(FLUID_LLM_MAX_ATTEMPTS=attempts, FLUID_LLM_DEADLINE_SECONDS=deadline)
    policy = RetryPolicy.from_env(env)
    assert 1 <= policy.attempts <= 100
    assert policy.deadline is not None  # from the environment, a call is always bounded
    assert 1.0 <= policy.deadline <= 86_400.0
    assert policy == RetryPolicy.model_validate(policy.model_dump())  # valid as a whole


strategies_text = st.one_of(
    padded(st.sampled_from(["truncate", "summarize", "hybrid", "TRUNCATE", "Hybrid"])), any_text
)


@given(rounds=env_values, compact=env_values, strategy=st.one_of(st.none(), strategies_text))
def test_loop_settings_from_env_is_always_valid(
    rounds: str | None, compact: str | None, strategy: str | None
) -> None:
    env = env_with(
        FLUID_AGENT_MAX_ROUNDS=rounds,
        FLUID_AGENT_COMPACT_AFTER=compact,
        FLUID_COMPACTION_STRATEGY=strategy,
    )
    loop = LoopSettings.from_env(env)
    assert 1 <= loop.max_rounds <= 200
    assert 1 <= loop.compact_after <= 200
    assert loop.compaction in {"truncate", "summarize", "hybrid"}
    if strategy is not None and strategy.strip().lower() in {"truncate", "summarize", "hybrid"}:
        assert loop.compaction == strategy.strip().lower()


# -- provider configuration -------------------------------------------------------------

KEY_VARS = sorted({v for info in PROVIDERS.values() for v in info.key_vars} | {"FLUID_LLM_API_KEY"})
URL_VARS = sorted(
    {info.base_url_var for info in PROVIDERS.values() if info.base_url_var}
    | {"AZURE_OPENAI_ENDPOINT"}
)
KEY_JUNK = ["", "", "\n", "\r\n", " ", "\t", "\x00", "\x7f", " trailing words", "\u200b"]


@st.composite
def api_keys(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A key as it lands in an environment (maybe with a pasted newline or a space inside),
    and the pieces of it that must never be shown."""
    body = draw(secret_bodies)
    prefix = draw(key_prefixes)
    lead = draw(st.sampled_from(["", "", " ", "\t"]))
    tail = draw(st.sampled_from(["", "", "", *KEY_JUNK]))
    if draw(st.integers(0, 3)):
        return lead + prefix + body + tail, [body]
    middle = draw(st.sampled_from(KEY_JUNK[2:]))
    return lead + prefix + body[:12] + middle + body[12:] + tail, [body[:12], body[12:]]


provider_names = st.one_of(
    st.sampled_from(sorted(PROVIDERS)),
    st.sampled_from(sorted(PROVIDERS)).map(str.upper),
    padded(st.sampled_from(["openai", "ollama", "azure"])),
    st.text(string.ascii_letters + "_-", max_size=12),
)
hosts = st.sampled_from(
    [
        "127.0.0.1",
        "localhost",
        "[::1]",
        "0.0.0.0",  # noqa: S104 - a listen address, as people put in OLLAMA_HOST
        "gpu-box.lan",
        "api.example.test",
        "[::1",
        "10.0.0.7",
        "",
    ]
)
urls = st.one_of(
    st.builds(
        lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
        st.sampled_from(["http://", "https://", "ftp://", "", "http:/", "//"]),
        hosts,
        st.sampled_from(["", ":8000", ":11434", ":0", ":99999", ":port"]),
        st.sampled_from(["", "/", "/v1", "/openai/v1?x=1", "#frag"]),
    ),
    any_text,
)


@st.composite
def provider_envs(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    """An environment, the arguments of the call, and the key pieces that must never show."""
    env: dict[str, str] = {}
    secrets: list[str] = []
    for name in draw(st.lists(st.sampled_from(KEY_VARS), max_size=4, unique=True)):
        key, pieces = draw(api_keys())
        env[name] = key
        secrets += pieces
    for name in draw(st.lists(st.sampled_from(URL_VARS), max_size=3, unique=True)):
        env[name] = draw(urls)
    optional = {
        "FLUID_LLM_PROVIDER": provider_names,
        "FLUID_LLM_MODEL": st.one_of(st.sampled_from(["gpt-4o", "my-deploy", " "]), any_text),
        "FLUID_LLM_TIMEOUT_SECONDS": st.one_of(
            padded(int_spellings), padded(float_spellings), odd_spellings, any_text
        ),
        "FLUID_OLLAMA_ALLOW_REMOTE": st.sampled_from(["1", "true", "0", "yes", ""]),
        "AZURE_OPENAI_API_VERSION": st.sampled_from(["2024-10-21", "", "x"]),
        "OPENAI_API_VERSION": st.sampled_from(["2024-06-01", ""]),
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        env[name] = draw(optional[name])
    args: dict[str, Any] = {}
    if draw(st.booleans()):
        args["provider"] = draw(st.sampled_from(sorted(PROVIDERS)))
    if draw(st.booleans()):
        args["model"] = draw(st.sampled_from(["m", "gpt-4o-mini"]))
    if draw(st.integers(0, 3)) == 0:
        key, pieces = draw(api_keys())
        args["api_key"] = key
        secrets += pieces
    if draw(st.integers(0, 3)) == 0:
        args["base_url"] = draw(urls)
    return env, args, secrets


def _rendered(error: ProviderError) -> str:
    return "\n".join([str(error), repr(error), json.dumps(error.to_dict())])


@SLOW
@given(case=provider_envs())
def test_resolve_provider_config_gives_a_config_or_a_documented_error(
    case: tuple[dict[str, str], dict[str, Any], list[str]],
) -> None:
    env, args, secrets = case
    # A key piece that is also given as a URL or a model is a coincidence, not a leak.
    others = [v for k, v in env.items() if k not in KEY_VARS]
    others += [str(v) for k, v in args.items() if k != "api_key"]
    assume(not any(piece in other for piece in secrets for other in others))
    try:
        config: ProviderConfig | ProviderError = resolve_provider_config(**args, env=env)
    except ProviderError as error:  # anything else fails the property
        config = error
    event(type(config).__name__ + (f"[{config.code}]" if isinstance(config, ProviderError) else ""))
    if isinstance(config, ProviderAuthError):
        assert config.code == "llm.auth"
        assert not config.retryable
        rendered = _rendered(config)
    elif isinstance(config, ProviderError):
        assert type(config) is ProviderError
        assert config.code in {"llm.not_configured", "llm.bad_endpoint"}
        assert not config.retryable
        rendered = _rendered(config)
    else:
        assert isinstance(config, ProviderConfig)
        assert config.provider in PROVIDERS
        assert config.model.strip()
        assert config.api_key is None or (
            config.api_key.isprintable() and not any(c.isspace() for c in config.api_key)
        )
        assert config.base_url is None or config.base_url.startswith(("http://", "https://"))
        assert 1.0 <= config.timeout <= 3600.0
        rendered = repr(config)
    for piece in secrets:
        assert piece not in rendered


# -- the cooldown store URL ---------------------------------------------------------------

# No separators, escapes, "~", "@" or ":": nothing may name a file outside the test's
# directory, nor a host other than loopback (a DNS lookup could hang the test).
url_text = st.text(st.characters(codec="ascii", exclude_characters="/\\~%@:"), max_size=20)


@st.composite
def cooldown_urls(draw: st.DrawFn, tmp: Path, port: int) -> str:
    # Not drawn: arbitrary text, which names a relative path (a file in the working directory).
    kind = draw(st.sampled_from(["keyword", "redis", "sqlite", "path", "scheme", "empty"]))
    if kind == "keyword":
        word = draw(st.sampled_from(["off", "none", "disabled", "0", "memory", "memory://"]))
        return draw(padding) + draw(st.sampled_from([word, word.upper()])) + draw(padding)
    if kind == "redis":
        scheme = draw(st.sampled_from(["redis", "rediss", "REDIS", "unix"]))
        auth = draw(st.sampled_from(["", ":pw@", "user:pw@", ":@"]))
        host = draw(st.sampled_from(["127.0.0.1", "localhost", "[::1]"]))
        port_text = draw(st.sampled_from([f":{port}", f":{port}", ":notaport", ":-1", ":99999"]))
        query = draw(st.sampled_from(["", "?socket_timeout=abc", "?db=2", "?decode_responses=1"]))
        return f"{scheme}://{auth}{host}{port_text}/{draw(url_text)}{query}"
    if kind == "sqlite":
        name = draw(url_text).replace(".", "_")
        return f"{draw(st.sampled_from(['sqlite', 'file', 'SQLITE']))}://{tmp}/{name}.db"
    if kind == "path":
        return f"{tmp}/{draw(url_text).replace('.', '_')}.sqlite3"
    if kind == "scheme":  # unknown schemes fall back to the default file, under XDG_CACHE_HOME
        return f"{draw(st.sampled_from(['http', 'mysql', 'memcache', 'x']))}://{draw(url_text)}"
    return draw(padding)


@pytest.fixture(scope="module")
def cooldown_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cooldown")


def _close(store: CooldownStore | None) -> None:
    primary = store.primary if isinstance(store, ResilientCooldownStore) else store
    if isinstance(primary, SqliteCooldownStore):
        primary.close()


@SLOW
@given(data=st.data())
def test_any_cooldown_url_gives_a_store_or_none_that_never_fails_a_call(
    cooldown_tmp: Path, data: st.DataObject
) -> None:
    urls = cooldown_urls(cooldown_tmp, closed_port())
    url = data.draw(urls, label="url")
    env = {"XDG_CACHE_HOME": str(cooldown_tmp / "cache"), "FLUID_COOLDOWN_URL": url}
    store = cooldown_store_from_url(url, env=env)
    try:
        assert (store is None) == (url.strip().lower() in {"off", "none", "disabled", "0"})
        event(repr(store).partition("(")[0] if store is not None else "None")
        if store is None:
            return
        assert isinstance(store, CooldownStore)
        primary = store.primary if isinstance(store, ResilientCooldownStore) else store
        if isinstance(primary, SqliteCooldownStore):  # a file, and only inside the test's directory
            assert Path(os.path.abspath(primary.path)).is_relative_to(cooldown_tmp)
        # A store that cannot reach its backend degrades; it never raises into a call.
        now = 1_700_000_000.0
        assert store.remaining("k", now) >= 0.0
        assert store.extend("k", 5.0, now) > 0.0
        assert 0.0 < store.remaining("k", now) <= 5.0
    finally:
        _close(store)


# -- the stored configuration ---------------------------------------------------------------


class MemoryKeyring(KeyringBackend):
    """A keyring in a dict: no example may reach the machine's real keyring."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.passwords: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.passwords.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.passwords[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        self.passwords.pop((service, username), None)


@pytest.fixture(scope="module")
def fake_keyring() -> Iterator[MemoryKeyring]:
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    try:
        yield backend
    finally:
        keyring.set_keyring(previous)


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("homes")


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=10))
source_values = st.one_of(st.sampled_from(["keyring", "file"]), json_scalars)


@st.composite
def stored_files(draw: st.DrawFn) -> tuple[bytes | None, int, dict[str, str]]:
    """The bytes of ai_config.json (None: no file), its mode, and the plaintext keys in it."""
    kind = draw(st.sampled_from(["none", "document", "document", "document", "bytes", "json"]))
    mode = draw(st.sampled_from([0o600, 0o600, 0o600, 0o600, 0o644, 0o640, 0o666]))
    if kind == "none":
        return None, mode, {}
    if kind == "bytes":
        return draw(st.binary(max_size=200)), mode, {}
    if kind == "json":
        return json.dumps(draw(st.one_of(json_scalars, st.lists(json_scalars)))).encode(), mode, {}
    providers = st.sampled_from(sorted(PROVIDERS))
    stored_keys = st.builds(lambda b: f"sk-stored-{b}", secret_bodies)
    provider = draw(providers)
    keys = draw(st.dictionaries(providers, stored_keys, max_size=3))
    sources = draw(st.dictionaries(providers, st.sampled_from(["keyring", "file"]), max_size=3))
    if draw(st.booleans()):  # the stored provider's own key, as setup writes it
        sources[provider] = draw(st.sampled_from(["keyring", "file"]))
        if sources[provider] == "file":
            keys[provider] = draw(stored_keys)
    document: dict[str, Any] = {
        "version": 1,
        "provider": provider,
        "model": draw(st.sampled_from(["gpt-4o", "my-model", " ", ""])),
        "key_sources": sources,
    }
    if draw(st.booleans()):  # a cloud provider's settings, as setup writes them, or garbage
        names = st.sampled_from([*STORED_SETTINGS, "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY"])
        values = st.one_of(st.sampled_from(["us-east-1", "my-proj", "global"]), any_text)
        owners = st.one_of(st.sampled_from(sorted(CLOUD_SETTINGS)), providers)
        document["settings"] = draw(
            st.dictionaries(owners, st.dictionaries(names, values, max_size=3), max_size=2)
        )
        if draw(st.booleans()):  # a cloud provider stored with its settings
            document["provider"] = draw(st.sampled_from(sorted(CLOUD_SETTINGS)))
    if draw(st.integers(0, 2)) == 0:  # one field of the wrong type or value
        field = draw(
            st.sampled_from(["version", "provider", "model", "key_sources", "keys", "settings"])
        )
        document[field] = draw(
            st.one_of(json_scalars, st.dictionaries(json_scalars.map(str), source_values))
        )
    elif keys:
        document["keys"] = keys
    return json.dumps(document).encode(), mode, keys


STORED_SETTINGS = sorted({v for names in CLOUD_SETTINGS.values() for v in names})
KNOWN = sorted(
    {"FLUID_LLM_PROVIDER", "FLUID_LLM_MODEL", "FLUID_LLM_API_KEY", *STORED_SETTINGS}
    | {v for info in PROVIDERS.values() for v in info.key_vars}
)


@SLOW
@given(
    stored=stored_files(),
    env=st.dictionaries(
        st.sampled_from(KNOWN),
        st.one_of(provider_names, st.sampled_from(["", " "]), any_text),
        max_size=3,
    ),
    opt_in=st.sampled_from([None, "1", "1", "true", "0", ""]),
    in_keyring=st.dictionaries(
        st.sampled_from(sorted(PROVIDERS)),
        st.builds(lambda b: f"sk-ring-{b}", secret_bodies),
        max_size=len(PROVIDERS),
    ),
)
def test_apply_stored_config_only_fills_what_the_environment_leaves_unset(
    fake_keyring: MemoryKeyring,
    homes: Path,
    stored: tuple[bytes | None, int, dict[str, str]],
    env: dict[str, str],
    opt_in: str | None,
    in_keyring: dict[str, str],
) -> None:
    content, mode, file_keys = stored
    home = Path(tempfile.mkdtemp(dir=homes))
    if content is not None:
        path = home / "ai_config.json"
        path.write_bytes(content)
        os.chmod(path, mode)
    fake_keyring.passwords = {("fluid_build", p): k for p, k in in_keyring.items()}
    env = {**env, "FLUID_HOME": str(home)}
    if opt_in is not None:
        env["FLUID_ALLOW_PLAINTEXT_AI_SECRETS"] = opt_in
    given_env = dict(env)

    out = apply_stored_config(env)

    event(f"filled {sorted(set(out) - set(env))}")
    assert env == given_env  # not changed
    for name, value in env.items():
        if value.strip():
            assert out[name] == value  # what the environment sets always wins
    added = set(out) - set(env) | {n for n in env if out[n] != env[n]}
    assert added <= set(KNOWN) - {"FLUID_LLM_API_KEY"}
    if "FLUID_LLM_PROVIDER" in added:
        assert out["FLUID_LLM_PROVIDER"] in PROVIDERS
    # A plaintext key is used only with the opt-in, from a file only its owner can read.
    private = mode & 0o077 == 0
    if opt_in not in {"1", "true"} or not private:
        assert not set(file_keys.values()) & set(out.values())
    # A key comes only from where setup put it.
    for name in added & {v for info in PROVIDERS.values() for v in info.key_vars}:
        assert out[name] in set(file_keys.values()) | set(in_keyring.values())
    # A cloud setting only for the provider in effect, that provider's, and only a name.
    in_effect = (out.get("FLUID_LLM_PROVIDER") or "").strip().lower()
    for name in added & set(STORED_SETTINGS):
        event(f"setting {name}")
        assert name in CLOUD_SETTINGS.get(in_effect, ())
        assert setting_problem(out[name]) is None


@pytest.mark.parametrize(
    ("env", "filled"),
    [
        ({}, {"GOOGLE_CLOUD_PROJECT": "my-proj"}),  # the stored provider's settings
        ({"GOOGLE_CLOUD_PROJECT": "mine"}, {}),  # the environment wins
        ({"FLUID_LLM_PROVIDER": "bedrock"}, {"AWS_REGION": "eu-west-3"}),
        ({"FLUID_LLM_PROVIDER": "openai"}, {}),  # another provider in effect: none
    ],
)
def test_stored_cloud_settings_fill_only_the_provider_in_effect(
    homes: Path, env: dict[str, str], filled: dict[str, str]
) -> None:
    home = Path(tempfile.mkdtemp(dir=homes))
    path = home / "ai_config.json"
    path.write_text(
        json.dumps(
            {
                "version": 1,
                "provider": "vertex",
                "settings": {
                    "vertex": {"GOOGLE_CLOUD_PROJECT": "my-proj", "GOOGLE_CLOUD_LOCATION": "a b"},
                    "bedrock": {"AWS_REGION": "eu-west-3", "AWS_SECRET_ACCESS_KEY": "x" * 40},
                },
            }
        )
    )
    os.chmod(path, 0o600)
    given_env = {**env, "FLUID_HOME": str(home)}
    out = apply_stored_config(given_env)
    assert {k: v for k, v in out.items() if k in STORED_SETTINGS and k not in env} == filled
    assert "AWS_SECRET_ACCESS_KEY" not in out


# -- every variable the library reads, through the public entry points -------------------

#: Every environment variable fluid_build reads (checked against the source below).
ENV_VARS = sorted(
    {
        "FLUID_LLM_PROVIDER",
        "FLUID_LLM_MODEL",
        "FLUID_LLM_API_KEY",
        "FLUID_LLM_TIMEOUT_SECONDS",
        "FLUID_LLM_MAX_ATTEMPTS",
        "FLUID_LLM_DEADLINE_SECONDS",
        "FLUID_LLM_FALLBACKS",
        "FLUID_LLM_TRANSPORT",
        "FLUID_LLM_MAX_CONNECTIONS",
        "FLUID_LLM_CONNECT_TIMEOUT_SECONDS",
        "FLUID_LLM_FIRST_TOKEN_TIMEOUT_SECONDS",
        "FLUID_LLM_IDLE_TIMEOUT_SECONDS",
        "FLUID_LLM_MOVE_ON_RETRY_AFTER_SECONDS",
        "FLUID_LLM_TEMPERATURE",
        "FLUID_LLM_MAX_OUTPUT_TOKENS",
        "FLUID_LLM_MAX_RESPONSE_BYTES",
        "FLUID_LLM_MAX_STREAM_EVENTS",
        "FLUID_LLM_MAX_EVENT_BYTES",
        "FLUID_BREAKER_THRESHOLD",
        "FLUID_BREAKER_COOL_OFF_SECONDS",
        "FLUID_BREAKER_WINDOW_SECONDS",
        "FLUID_BREAKER_TRIAL_SECONDS",
        "FLUID_COOLDOWN_URL",
        "FLUID_OLLAMA_ALLOW_REMOTE",
        "FLUID_OPENAI_STRICT_SCHEMA",
        "FLUID_QUIET",
        "FLUID_NONINTERACTIVE",
        "FLUID_HOME",
        "FLUID_ALLOW_PLAINTEXT_AI_SECRETS",
        "FLUID_AGENT_MAX_ROUNDS",
        "FLUID_AGENT_COMPACT_AFTER",
        "FLUID_COMPACTION_STRATEGY",
        "FLUID_CAPABILITY_MATRIX",
        "FLUID_RATE_LIMITS",
        "FLUID_OTEL",
        "FLUID_PRICES",
        "FLUID_BUDGETS",
        "FLUID_BUDGET",
        "FLUID_BUDGET_FAIL_OPEN",
        "AZURE_OPENAI_ENDPOINT",
        "AZURE_OPENAI_API_VERSION",
        "OPENAI_API_VERSION",
        "OLLAMA_HOST",
        "XDG_CACHE_HOME",
        "XDG_CONFIG_HOME",
        "FLUID_COLOR",
        "TIKTOKEN_CACHE_DIR",
        "DATA_GYM_CACHE_DIR",
        *KEY_VARS,
        *URL_VARS,
    }
)
#: bedrock's and vertex's variables (fuzzed by the cloud test below): read from the mapping
#: a caller passes ...
CLOUD_VARS = (
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
    "AWS_BEARER_TOKEN_BEDROCK",
    "AWS_PROFILE",
    "GOOGLE_CLOUD_PROJECT",
    "GOOGLE_CLOUD_LOCATION",
)
#: ... or by botocore and google-auth themselves, from the process environment.
PROCESS_VARS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "CLOUDSDK_CONFIG",
    "CLOUDSDK_CORE_PROJECT",
    "CLOUDSDK_ACTIVE_CONFIG_NAME",
)
#: Any value of these says "ask a metadata service" (AWS's, Google's): they are held at a
#: closed loopback port or off in every fuzzed case, and get their own test below.
METADATA_VARS = (
    "AWS_EC2_METADATA_DISABLED",
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "K_SERVICE",
    "CLOUD_RUN_JOB",
    "FUNCTION_TARGET",
)
# Names in the source that look like variables but are constants (module attributes).
_NOT_VARIABLES = {
    "ANTHROPIC_VERSION",
    "AZURE_API_VERSION",
    "FLUID_HOME_ENV",
    "XDG_CONFIG_HOME_ENV",
    "OLLAMA_DEFAULT_HOST",
    "FLUID_FUZZ_VALUE",
}


def test_every_variable_the_source_reads_is_fuzzed() -> None:
    source = Path(__file__).resolve().parents[1] / "src" / "fluid_build"
    pattern = re.compile(
        r"[\"']((?:FLUID|OPENAI|AZURE|ANTHROPIC|GEMINI|GOOGLE|GROQ|MISTRAL|OPENROUTER|OLLAMA|"
        r"XDG|TIKTOKEN|DATA_GYM|XAI|DEEPSEEK|TOGETHER|FIREWORKS|CEREBRAS|AWS|GCE|CLOUDSDK|"
        r"CLOUD_RUN|K|FUNCTION)_[A-Z0-9_]+)[\"']"
    )
    found = {m for path in source.rglob("*.py") for m in pattern.findall(path.read_text())}
    fuzzed = {*ENV_VARS, *CLOUD_VARS, *PROCESS_VARS, *METADATA_VARS}
    missing = sorted(found - fuzzed - _NOT_VARIABLES)
    assert not missing, f"read by the library but not fuzzed here: {missing}"


ENV_GARBAGE = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "\t\n",
            "abc",
            "-1",
            "0",
            "nan",
            "inf",
            "-inf",
            "1e999",
            "9" * 40,
            "http://[",
            "http://[::1",
            "sqlite://",
            "file://",
            "redis://:bad@127.0.0.1:notaport/0",
            "gopher://x",
            "http://h:0",
            "http://h:99999",
            "http://exa mple.com",
            "https://",
            "https://user:hunter2@h:notaport/v1?key=abc",
            "a\x00b",
            "x\ny",
            "\x1b[31mred",
            "true",
            "yes",
            "off",
            "memory://",
            "openai",
            "ollama",
            "abc,,:m",
            "30",
        ]
    ),
    padded(int_spellings),
    padded(float_spellings),
    st.text(string.ascii_letters + string.digits + " -_.", max_size=20),
)
BASE_ENVS = [
    {},
    {"OPENAI_API_KEY": "sk-proj-FUZZBASEKEY0123456789abcd"},
    {"FLUID_LLM_PROVIDER": "ollama"},
    {"ANTHROPIC_API_KEY": "sk-ant-api03-FUZZBASEKEY0123456789"},
    {
        "FLUID_LLM_PROVIDER": "azure",
        "AZURE_OPENAI_API_KEY": "FUZZBASEKEY0123456789abcdef",
        "AZURE_OPENAI_ENDPOINT": "https://r.openai.azure.com",
        "FLUID_LLM_MODEL": "deployment",
    },
    {"FLUID_LLM_PROVIDER": "vllm", "OPENAI_BASE_URL": "http://127.0.0.1:8000/v1"},
]
# Known: read (and warned about) twice per client, by RetryPolicy.from_env (default: no
# limit) and by the wire's deadline_from_env (default 600 s), with different defaults.
_READ_TWICE = {"FLUID_LLM_DEADLINE_SECONDS"}
# A valid value in a message: VAR=value, an argument ('x'), or "e.g." / "takes '...'".
_EXAMPLE = re.compile(r"\b[A-Z][A-Z0-9_]{2,}=\S|\w='\S|e\.g\.|takes '")


def _mentions(text: str) -> list[str]:
    return [name for name in ENV_VARS if name in text]


@SLOW
@given(
    base=st.sampled_from(BASE_ENVS),
    garbage=st.dictionaries(
        st.sampled_from([v for v in ENV_VARS if v != "FLUID_LLM_FALLBACKS"]),
        ENV_GARBAGE,
        min_size=1,
        max_size=3,
    ),
    fallbacks=st.one_of(st.none(), st.sampled_from(["abc", ",,", ":m", " : ", "x\x00"])),
)
def test_garbage_in_any_variable_gives_a_default_and_a_warning_or_a_typed_error(
    cooldown_tmp: Path,
    base: dict[str, str],
    garbage: dict[str, str],
    fallbacks: str | None,
) -> None:
    env = {**base, **garbage, "XDG_CACHE_HOME": str(cooldown_tmp / "cache")}
    if "XDG_CACHE_HOME" in garbage and garbage["XDG_CACHE_HOME"].startswith("/"):
        env["XDG_CACHE_HOME"] = garbage["XDG_CACHE_HOME"]
    env.setdefault("FLUID_HOME", str(cooldown_tmp / "home"))
    if fallbacks is not None:
        env["FLUID_LLM_FALLBACKS"] = fallbacks
    # A key is never shown; a value that is also set elsewhere is not a secret there.
    others = [v for k, v in env.items() if k not in KEY_VARS]
    secrets = [
        v.strip()
        for k, v in env.items()
        if k in KEY_VARS and len(v.strip()) > 8 and not any(v.strip() in o for o in others)
    ]
    secrets.append("hunter2")  # the password of a URL
    entry_points = {
        "LLMClient.from_env": lambda: LLMClient.from_env(env),
        "RetryEnvelope.from_env": lambda: RetryEnvelope.from_env(env),
        "cooldown_store_from_env": lambda: cooldown_store_from_env(env),
        "apply_stored_config": lambda: apply_stored_config(env),
        "LoopSettings.from_env": lambda: LoopSettings.from_env(env),
    }
    for name, entry in entry_points.items():
        with library_log() as records:
            error: FluidError | None = None
            try:
                made = entry()
            except FluidError as raised:  # anything else fails the property
                error, made = raised, None
            if error is not None:
                event(f"{name}: {type(error).__name__}")
                text = str(error)
                assert _mentions(text), f"{name}: {text!r} names no variable"
                assert _EXAMPLE.search(text), f"{name}: {text!r} shows no valid value"
                for secret in secrets:
                    assert secret not in text + repr(error)
            close = getattr(made, "close", None)
            if callable(close):
                close()
            _close(getattr(made, "cooldown", None))
            _close(made if isinstance(made, CooldownStore) else None)
        warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
        per_variable: dict[str, int] = {}
        for message in warnings:
            named = _mentions(message)
            assert named, f"{name}: the warning {message!r} names no variable"
            per_variable[named[0]] = per_variable.get(named[0], 0) + 1
            for secret in secrets:
                assert secret not in message
        twice = {v for v, n in per_variable.items() if n > 1} - _READ_TWICE
        assert not twice, (name, warnings)


@contextmanager
def library_log() -> Iterator[list[logging.LogRecord]]:
    """Every record the ``fluid_build`` loggers emit inside the block."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("fluid_build")
    handler = Keep(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# -- values that once escaped untyped, or warned twice --------------------------------------


def test_a_cooldown_path_under_an_unknown_users_home_does_not_crash(tmp_path: Path) -> None:
    env = {
        "FLUID_COOLDOWN_URL": "~nosuchuser-fluid/cooldown.sqlite3",
        "XDG_CACHE_HOME": str(tmp_path),
    }
    with library_log() as records:
        store = cooldown_store_from_env(env)
    try:
        assert store is not None
        store.extend("k", 5.0, now=0.0)  # the default file works
        assert store.remaining("k", now=1.0) == pytest.approx(4.0)
    finally:
        _close(store)
    assert any("unknown user" in r.getMessage() for r in records)
    assert list(tmp_path.rglob("*.sqlite3"))  # under XDG_CACHE_HOME, the default place


def test_an_unknown_fallback_provider_names_fluid_llm_fallbacks() -> None:
    env = {
        "OPENAI_API_KEY": "sk-proj-FALLBACKKEY0123456789abcd",
        "FLUID_LLM_FALLBACKS": "bogus:model",
        "FLUID_COOLDOWN_URL": "memory://",
    }
    with pytest.raises(ProviderError) as caught:
        LLMClient.from_env(env)
    assert "FLUID_LLM_FALLBACKS" in caught.value.message
    assert caught.value.details["variable"] == "FLUID_LLM_FALLBACKS"
    assert "anthropic:" in caught.value.details["example"]


def test_a_bad_deadline_warns_once_per_client() -> None:
    env = {
        "OPENAI_API_KEY": "sk-proj-DEADLINEKEY0123456789abcd",
        "FLUID_LLM_DEADLINE_SECONDS": "soon",
        "FLUID_COOLDOWN_URL": "memory://",
    }
    with library_log() as records:
        LLMClient.from_env(env).close()
    assert len([r for r in records if "FLUID_LLM_DEADLINE_SECONDS" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("HTTPS_PROXY", "gopher://user:hunter2secret@proxy.invalid"),
        ("ALL_PROXY", "socks5://127.0.0.1:1"),  # socksio is not installed
        ("ALL_PROXY", "::::"),
        ("SSL_CERT_FILE", "/nonexistent/ca.pem"),
        ("SSL_CERT_FILE", os.devnull),  # a file with no certificate in it
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
def test_an_unusable_proxy_or_certificate_variable_is_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, streaming: bool
) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "SSL_CERT_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, value)
    env = {"OPENAI_API_KEY": "sk-proj-PROXYKEY0123456789abcdef", "FLUID_COOLDOWN_URL": "memory://"}
    with LLMClient.from_env(env) as client, pytest.raises(ProviderError) as caught:
        list(client.stream("hi")) if streaming else client.complete("hi")
    error = caught.value
    assert error.code == "llm.not_configured"
    assert not error.retryable
    assert error.details["variable"] == variable
    assert variable in error.message
    assert "hunter2secret" not in str(error)
    assert error.__cause__ is None  # the raw httpx/ssl error does not travel with it


# -- FLUID_CAPABILITY_MATRIX: overrides or a typed error ----------------------------------

_MATRIX_KEYS = st.sampled_from(
    [
        "context_window",
        "max_output_tokens",
        "output_reservation",
        "tools",
        "strict_schema",
        "json_mode",
        "preflight",
        "tokenizer",
        "context_windw",
        "azure:d",
        "d",
        "",
    ]
)
_MATRIX_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(allow_nan=True),
        st.text(max_size=12),
        st.sampled_from(["o200k_base", "claude", "bpe"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(_MATRIX_KEYS, inner, max_size=4)
    ),
    max_leaves=12,
)
_MATRIX_TEXT = st.one_of(
    st.dictionaries(_MATRIX_KEYS, _MATRIX_VALUES, max_size=5).map(json.dumps),
    _MATRIX_VALUES.map(json.dumps),
    padded(st.text(max_size=40)),
    st.sampled_from(["{", "[", "{]", '{"a": {"b": {"c": {"d": {"e": 1}}}}}', "/dev/zero", "~x"]),
)


@SLOW
@given(raw=_MATRIX_TEXT, model=st.sampled_from(["d", "gpt-4o", "D"]))
def test_capability_matrix_from_env_gives_overrides_or_a_typed_error(raw: str, model: str) -> None:
    from fluid_build.copilot.call.capabilities import (
        OVERRIDE_KEYS,
        capabilities_for,
        capability_matrix_from_env,
    )

    error: ProviderError | None = None
    try:
        overrides = capability_matrix_from_env({"FLUID_CAPABILITY_MATRIX": raw}, "azure", model)
    except ProviderError as raised:
        error, overrides = raised, {}
    if error is not None:
        assert error.code == "llm.not_configured"
        assert error.details["variable"] == "FLUID_CAPABILITY_MATRIX"
        assert str(error).startswith("FLUID_CAPABILITY_MATRIX")
        assert _EXAMPLE.search(str(error))
        return
    assert set(overrides) <= OVERRIDE_KEYS
    capabilities_for("azure", model, overrides)  # what the reader passed is valid input


# -- the cloud providers' variables: bedrock, vertex ----------------------------------------

CLOUD_BASES = [
    {"FLUID_LLM_PROVIDER": "bedrock", "AWS_REGION": "us-east-1"},
    {
        "FLUID_LLM_PROVIDER": "bedrock",
        "AWS_BEARER_TOKEN_BEDROCK": "ABSKFUZZBEARER0123456789abcdef",
        "AWS_REGION": "eu-west-3",
    },
    {"FLUID_LLM_PROVIDER": "vertex", "GOOGLE_CLOUD_PROJECT": "fuzz-project"},
    {"FLUID_LLM_PROVIDER": "vertex", "FLUID_LLM_API_KEY": "ya29.FUZZTOKEN0123456789abcdef"},
    {
        "FLUID_LLM_PROVIDER": "xai",
        "XAI_API_KEY": "xai-FUZZBASEKEY0123456789abcdef",
        "FLUID_LLM_MODEL": "grok-4",
    },
    {
        "FLUID_LLM_PROVIDER": "deepseek",
        "DEEPSEEK_API_KEY": "sk-FUZZDEEPSEEK0123456789abcd",
        "FLUID_LLM_MODEL": "deepseek-chat",
    },
]
_CLOUD_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_BEARER_TOKEN_BEDROCK")


@contextmanager
def process_env(values: dict[str, str]) -> Iterator[None]:
    """``values`` in os.environ inside the block (botocore and google-auth read it there)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@SLOW
@given(
    base=st.sampled_from(CLOUD_BASES),
    garbage=st.dictionaries(
        st.sampled_from(sorted({*CLOUD_VARS, *PROCESS_VARS})), ENV_GARBAGE, min_size=1, max_size=4
    ),
)
def test_garbage_in_the_cloud_variables_gives_a_typed_error_and_no_secret_or_call(
    cooldown_tmp: Path, base: dict[str, str], garbage: dict[str, str]
) -> None:
    from fluid_build.cli.doctor import collect_report

    # An environment cannot hold a NUL: such a value cannot reach botocore or google-auth.
    assume(not any("\x00" in value for value in garbage.values()))
    port = closed_port()
    home = cooldown_tmp / "cloud-home"  # no ~/.aws, no gcloud login: only what is fuzzed
    env = {
        **base,
        **garbage,
        "HOME": str(home),
        "FLUID_HOME": str(cooldown_tmp / "home"),
        "FLUID_COOLDOWN_URL": "memory://",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{port}",
    }
    others = [v for k, v in env.items() if k not in (*KEY_VARS, *_CLOUD_SECRETS)]
    secrets = [
        v.strip()
        for k, v in env.items()
        if k in (*KEY_VARS, *_CLOUD_SECRETS)
        and len(v.strip()) > 8
        and not any(v.strip() in o for o in others)
    ]
    secrets.append("hunter2")
    process = {k: v for k, v in env.items() if k in PROCESS_VARS or k.startswith("AWS_EC2")}
    process.setdefault("CLOUDSDK_CONFIG", str(home / "gcloud"))
    for name in PROCESS_VARS:  # unset unless fuzzed: nothing of the machine's leaks in
        process.setdefault(name, "")
    with process_env(process):
        for name, entry in {
            "LLMClient.from_env": lambda: LLMClient.from_env(env),
            "resolve_provider_config": lambda: resolve_provider_config(env=env),
        }.items():
            error: FluidError | None = None
            try:
                made = entry()
            except FluidError as raised:  # anything else (a crash, a network try) fails
                error, made = raised, None
            if error is not None:
                event(f"{name}: {type(error).__name__} [{getattr(error, 'code', None)}]")
                text = str(error) + repr(error)
                assert _mentions(str(error)) or any(v in str(error) for v in CLOUD_VARS), text
                for secret in secrets:
                    assert secret not in text
            close = getattr(made, "close", None)
            if callable(close):
                close()
        report = collect_report(env)
    shown = json.dumps(report)
    for secret in secrets:
        assert secret not in shown
    rows = {row["name"]: row for row in report["providers"]}
    for cloud in ("bedrock", "vertex"):
        found = rows[cloud].get("credentials")
        assert found is not None, rows[cloud]  # never the broken-row finding
        assert found["source"] is None or isinstance(found["source"], str)


def test_on_google_cloud_the_metadata_server_is_asked_on_loopback_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each variable that says "on Google Cloud", with the metadata server at a closed
    loopback port: a typed error, google-auth's waits recorded instead of slept. Making
    the client asks nothing (no project: refused naming GOOGLE_CLOUD_PROJECT); the first
    call's credential lookup asks the metadata server."""
    import google.auth._exponential_backoff as backoff

    waits: list[float] = []
    monkeypatch.setattr(backoff.time, "sleep", waits.append)
    host = f"127.0.0.1:{closed_port()}"
    for name in ("GCE_METADATA_HOST", "K_SERVICE", "CLOUD_RUN_JOB", "FUNCTION_TARGET"):
        values = {
            "GCE_METADATA_IP": host,
            "GCE_METADATA_HOST": host,
            name: host if name.startswith("GCE") else "fuzz\x1b[31m",
            "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        }
        env = {"FLUID_LLM_PROVIDER": "vertex", "FLUID_COOLDOWN_URL": "memory://", **values}
        with process_env(values):
            with pytest.raises(ProviderError) as refused:
                LLMClient.from_env(env)
            assert refused.value.code == "llm.not_configured"
            assert refused.value.details["variable"] == "GOOGLE_CLOUD_PROJECT"
            client = LLMClient.from_env({**env, "GOOGLE_CLOUD_PROJECT": "fuzz-project"})
            with client, pytest.raises(ProviderAuthError) as caught:
                client.complete("hi")
        assert "gcloud auth application-default login" in caught.value.message
    assert waits  # google-auth's ping backed off: recorded, never slept
