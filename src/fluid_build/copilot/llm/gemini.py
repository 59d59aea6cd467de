"""Gemini's generateContent, with function calling and a JSON response schema."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from fluid_build.copilot.agents.errors import ProviderError
from fluid_build.copilot.llm.answer_shape import COUNT, NULL, TEXT, text_of
from fluid_build.copilot.llm.base import SAMPLING_OPTIONS, Adapter, Parsed, Request, StreamState
from fluid_build.copilot.llm.types import CallSpec, StreamEvent, ToolCall, Usage

__all__ = ["GeminiAdapter"]

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
# MODEL_ARMOR: Vertex AI's Model Armor screened the prompt or the answer.
_BLOCKED = {"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "RECITATION", "MODEL_ARMOR"}

#: ``reasoning_effort`` -> ``thinkingConfig.thinkingBudget`` on Gemini 2.5 (1024 up to
#: 24576, the most 2.5 Flash takes; 2.5 Pro takes 128 to 32768). Gemini 3 and later
#: take ``thinkingLevel`` instead (docs/llm-providers.md, "Call options").
#: An answer read with ``$alt=json;enum-encoding=int`` (or through a proxy that keeps the
#: protobuf numbers) names its enums by number. The names, from Google's API reference:
#: the Gemini API's Candidate.FinishReason and PromptFeedback.BlockReason
#: (google/ai/generativelanguage/v1beta/generative_service.proto). Vertex AI numbers
#: them differently (see vertex.py).
#: Candidate.FinishReason's numbers up to 5, the same on both APIs: from 6 on they part.
SHARED_FINISH_REASONS: Final = {
    0: "FINISH_REASON_UNSPECIFIED",
    1: "STOP",
    2: "MAX_TOKENS",
    3: "SAFETY",
    4: "RECITATION",
    5: "OTHER",
}
FINISH_REASONS: Final = {
    **SHARED_FINISH_REASONS,
    6: "LANGUAGE",
    7: "BLOCKLIST",
    8: "PROHIBITED_CONTENT",
    9: "SPII",
    10: "MALFORMED_FUNCTION_CALL",
    11: "IMAGE_SAFETY",
    12: "UNEXPECTED_TOOL_CALL",
    13: "TOO_MANY_TOOL_CALLS",
    14: "IMAGE_PROHIBITED_CONTENT",
    15: "IMAGE_OTHER",
    16: "NO_IMAGE",
    17: "IMAGE_RECITATION",
}
BLOCK_REASONS: Final = {
    0: "BLOCK_REASON_UNSPECIFIED",
    1: "SAFETY",
    2: "OTHER",
    3: "BLOCKLIST",
    4: "PROHIBITED_CONTENT",
    5: "IMAGE_SAFETY",
}
#: SafetyRating's HarmCategory (google/ai/generativelanguage/v1beta/safety.proto) and
#: HarmProbability (the same numbers on Vertex AI).
HARM_CATEGORIES: Final = {
    0: "HARM_CATEGORY_UNSPECIFIED",
    1: "HARM_CATEGORY_DEROGATORY",
    2: "HARM_CATEGORY_TOXICITY",
    3: "HARM_CATEGORY_VIOLENCE",
    4: "HARM_CATEGORY_SEXUAL",
    5: "HARM_CATEGORY_MEDICAL",
    6: "HARM_CATEGORY_DANGEROUS",
    7: "HARM_CATEGORY_HARASSMENT",
    8: "HARM_CATEGORY_HATE_SPEECH",
    9: "HARM_CATEGORY_SEXUALLY_EXPLICIT",
    10: "HARM_CATEGORY_DANGEROUS_CONTENT",
}
HARM_PROBABILITIES: Final = {
    0: "HARM_PROBABILITY_UNSPECIFIED",
    1: "NEGLIGIBLE",
    2: "LOW",
    3: "MEDIUM",
    4: "HIGH",
}
#: The values that say "none given": not a block, not the end of a stream.
_UNSPECIFIED: Final = frozenset(
    {"FINISH_REASON_UNSPECIFIED", "BLOCK_REASON_UNSPECIFIED", "BLOCKED_REASON_UNSPECIFIED"}
)


def enum_name(value: Any, names: Mapping[int, str]) -> str | None:
    """An enum field as its name: a name as sent, a number by ``names`` (one fluid does not
    know as its digits), None for none or an "unspecified" value; anything else (a list,
    an object) is a shape error."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise TypeError("an enum field is true/false")
    if isinstance(value, int):
        name = names.get(value, str(value))
    elif isinstance(value, str):
        name = value
    else:
        raise TypeError("an enum field is neither a name nor a number")
    return None if name in _UNSPECIFIED else name


THINKING_BUDGETS: Final = {"low": 1024, "medium": 8192, "high": 24576}
_VERSION: Final = re.compile(r"gemini-(\d+)(?:\.(\d+))?")
_CHOICES: Final = {"auto": "AUTO", "none": "NONE", "required": "ANY"}


def thinking_kind(model: str) -> str | None:
    """How ``model`` is told how much to think: ``"level"`` (Gemini 3 and later),
    ``"budget"`` (Gemini 2.5, and a Gemini whose version its name does not say, such as
    ``gemini-flash-latest``: every thinking Gemini takes a budget), or None (no
    thinking: Gemini 2.0 and before, Gemma). A name fluid does not know (a tuned
    model's endpoint) is given the benefit of the doubt: a budget."""
    if "gemma" in model:
        return None
    found = _VERSION.search(model)
    if found is None:
        return "budget"
    version = (int(found.group(1)), int(found.group(2) or 0))
    if version >= (3, 0):
        return "level"
    return "budget" if version >= (2, 5) else None


def thinking_config(effort: str, model: str) -> dict[str, Any]:
    if thinking_kind(model) == "level":
        # The enum's names, as google-genai sends them to the Gemini API and Vertex alike.
        return {"thinkingLevel": effort.upper()}
    return {"thinkingBudget": THINKING_BUDGETS[effort]}


def gemini_contents(spec: CallSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for message in spec.messages:
        role = message.get("role", "user")
        content = message.get("content") or ""
        if role == "tool":
            response = {"content": content}
            part = {"functionResponse": {"name": message.get("name", ""), "response": response}}
            out.append({"role": "user", "parts": [part]})
        elif role == "assistant":
            parts: list[dict[str, Any]] = [{"text": content}] if content else []
            parts += [
                {"functionCall": {"name": c["name"], "args": c.get("arguments", {})}}
                for c in message.get("tool_calls") or []
            ]
            out.append({"role": "model", "parts": parts})
        else:
            out.append({"role": "user", "parts": [{"text": content}]})
    return out


def _count(meta: dict[str, Any], name: str) -> int:
    value = meta.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _usage(data: dict[str, Any]) -> Usage:
    """Thinking is output the budget pays for: thoughtsTokenCount is added to the answer's.

    ``promptTokenCount`` already includes ``cachedContentTokenCount``; the
    prompt of a tool the model ran (``toolUsePromptTokenCount``) is input too.
    """
    meta = data.get("usageMetadata")
    if not isinstance(meta, dict):
        return Usage()
    thoughts = _count(meta, "thoughtsTokenCount")
    return Usage(
        input_tokens=_count(meta, "promptTokenCount") + _count(meta, "toolUsePromptTokenCount"),
        output_tokens=_count(meta, "candidatesTokenCount") + thoughts,
        reasoning_tokens=thoughts,
        cache_read_tokens=_count(meta, "cachedContentTokenCount"),
    )


_SHAPE = {
    "candidates": [
        {
            "content": {
                "parts": [
                    {
                        "text": TEXT,
                        "thought": (bool, NULL),
                        "functionCall": {"id": TEXT, "name": TEXT, "args": (dict, NULL)},
                    }
                ]
            },
            "finishReason": (str, int, NULL),
        }
    ],
    "promptFeedback": {"blockReason": (str, int, NULL)},
    "usageMetadata": {
        "promptTokenCount": COUNT,
        "candidatesTokenCount": COUNT,
        "thoughtsTokenCount": COUNT,
        "cachedContentTokenCount": COUNT,
        "toolUsePromptTokenCount": COUNT,
    },
    "modelVersion": TEXT,
}


class GeminiAdapter(Adapter):
    provider = "gemini"
    shape: ClassVar[Any] = _SHAPE
    chunk_shape: ClassVar[Any] = _SHAPE
    default_base_url = GEMINI_BASE_URL
    key_header = ("x-goog-api-key", "{key}")  # a header, never the URL
    models_path: ClassVar[str | None] = "/models"
    models_query: ClassVar[Mapping[str, str | int]] = {"pageSize": 1000}
    #: What says a stream is over; one that ends without it was cut (see call/core.py).
    stream_end: ClassVar[str] = "a candidate with a finishReason"
    #: No ``parallel_tool_calls``: generateContent has no such field.
    options: ClassVar[frozenset[str]] = SAMPLING_OPTIONS - {"parallel_tool_calls"}
    sampling_names: ClassVar[Mapping[str, str]] = {
        "temperature": "temperature",
        "top_p": "topP",
        "stop": "stopSequences",
        "seed": "seed",
    }

    def supported_options(self, model: str) -> frozenset[str]:
        if thinking_kind(model.removeprefix("models/")) is None:
            return self.options - {"reasoning_effort"}
        return self.options

    def request(self, spec: CallSpec, *, stream: bool) -> Request:
        base = (self.config.base_url or GEMINI_BASE_URL).rstrip("/")
        model = spec.model.removeprefix("models/")
        action = "streamGenerateContent?alt=sse" if stream else "generateContent"
        headers = self.json_headers()
        body: dict[str, Any] = {"contents": gemini_contents(spec)}
        if spec.system:
            body["systemInstruction"] = {"parts": [{"text": spec.system}]}
        if spec.tools:
            body["tools"] = [
                {
                    "functionDeclarations": [
                        {
                            "name": t.name,
                            "description": t.description,
                            "parametersJsonSchema": dict(t.parameters),
                        }
                        for t in spec.tools
                    ]
                }
            ]
        if spec.tools and spec.tool_choice is not None:
            calling: dict[str, Any] = {"mode": _CHOICES.get(spec.tool_choice, "ANY")}
            if spec.tool_choice not in _CHOICES:
                calling["allowedFunctionNames"] = [spec.tool_choice]
            body["toolConfig"] = {"functionCallingConfig": calling}
        config = self.sampling(spec)
        if spec.response_schema is not None:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = dict(spec.response_schema)
        if spec.max_output_tokens is not None:
            config["maxOutputTokens"] = spec.max_output_tokens
        if spec.reasoning_effort is not None:
            config["thinkingConfig"] = thinking_config(spec.reasoning_effort, model)
        if config:
            body["generationConfig"] = config
        return self.post(spec, f"{base}/models/{model}:{action}", headers, body)

    #: This API's numbers for FinishReason, BlockReason and HarmCategory
    #: (``enum-encoding=int``).
    finish_reasons: ClassVar[Mapping[int, str]] = FINISH_REASONS
    block_reasons: ClassVar[Mapping[int, str]] = BLOCK_REASONS
    harm_categories: ClassVar[Mapping[int, str]] = HARM_CATEGORIES

    def _ratings(self, holder: Any) -> list[dict[str, Any]]:
        """The safety ratings of a blocked prompt or answer, names for numbers; what is not
        a rating is passed over (the block is the error, not its ratings' shape)."""
        ratings = holder.get("safetyRatings") if isinstance(holder, dict) else None
        out: list[dict[str, Any]] = []
        for rating in ratings[:20] if isinstance(ratings, list) else []:
            if not isinstance(rating, dict):
                continue
            try:
                category = enum_name(rating.get("category"), self.harm_categories)
                probability = enum_name(rating.get("probability"), HARM_PROBABILITIES)
            except TypeError:
                continue
            if category:
                out.append(
                    {
                        "category": category,
                        "probability": probability,
                        "blocked": rating.get("blocked") is True,
                    }
                )
        return out

    def _finish(self, candidate: dict[str, Any]) -> str | None:
        return enum_name(candidate.get("finishReason"), self.finish_reasons)

    def _check_blocked(self, data: dict[str, Any], spec: CallSpec) -> None:
        feedback = data.get("promptFeedback") or {}
        candidates = data.get("candidates") or []
        reason = enum_name(feedback.get("blockReason"), self.block_reasons)
        ratings = self._ratings(feedback)
        if not reason and candidates:
            finish = self._finish(candidates[0])
            reason = finish if finish in _BLOCKED else None
            ratings = self._ratings(candidates[0])
        if reason:
            flagged = [r for r in ratings if r["blocked"]] or ratings
            why = ", ".join(f"{r['category']}: {r['probability']}" for r in flagged[:3])
            raise ProviderError(
                f"{self.provider} ({spec.model}) refused the request: blocked for {reason}"
                + (f" ({why})" if why else ""),
                provider=self.provider,
                model=spec.model,
                status_code=200,
                provider_error_type=str(reason),
                code="llm.content_filtered",
                retryable=False,
                details={"safety_ratings": ratings} if ratings else None,
            )

    def parse(self, data: Any, spec: CallSpec) -> Parsed:
        self._check_blocked(data, spec)
        candidate = (data.get("candidates") or [{}])[0]
        texts: list[str] = []
        calls: list[ToolCall] = []
        for part in (candidate.get("content") or {}).get("parts") or []:
            if part.get("thought"):
                continue  # thinking summaries are not the answer
            if "text" in part:
                texts.append(text_of(part["text"]))
            elif "functionCall" in part:
                call = part["functionCall"] or {}
                raw_args = call.get("args")
                args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
                calls.append(
                    ToolCall(
                        id=str(call.get("id") or f"call_{len(calls)}"),
                        name=str(call.get("name") or ""),
                        arguments=args,
                    )
                )
        return Parsed(
            "".join(texts),
            calls,
            _usage(data),
            self._finish(candidate),
            data.get("modelVersion"),
        )

    def chunk_events(
        self, data: dict[str, Any], event: str, state: StreamState, spec: CallSpec
    ) -> list[StreamEvent]:
        self._check_blocked(data, spec)
        events: list[StreamEvent] = []
        if data.get("usageMetadata"):
            state.usage = _usage(data)
        state.model = data.get("modelVersion") or state.model
        candidate = (data.get("candidates") or [{}])[0]
        for part in (candidate.get("content") or {}).get("parts") or []:
            if part.get("thought"):
                continue
            if "text" in part:
                text_event = state.add_text(text_of(part["text"]))
                if text_event:
                    events.append(text_event)
            elif "functionCall" in part:
                call = part["functionCall"] or {}
                index = len(state.calls)
                events.append(
                    state.add_call(
                        index,
                        id=str(call.get("id") or f"call_{index}"),
                        name=str(call.get("name") or ""),
                        arguments_delta=json.dumps(call.get("args") or {}),
                    )
                )
        finish = self._finish(candidate)
        if finish:
            state.finish_reason = finish
            state.done = True
        return events
