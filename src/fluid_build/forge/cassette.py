"""A forge run as a cassette: what ``fluid forge --record`` writes and ``--replay`` reads.

The cassette is the format of :mod:`fluid_build.corpus.cassette`, made by a
:class:`~fluid_build.corpus.record.Recorder` that keeps each request's
body too (redacted like the answers), so that a replay names the first
request that differs. ``bodies=False`` keeps no prompt, no request body and
no model output (then a forge replay has nothing to answer with).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pydantic import ValidationError

from fluid_build.corpus.cassette import CallRecipe, Cassette
from fluid_build.corpus.record import Recorder, recipe_env
from fluid_build.forge.intent import Intent

if TYPE_CHECKING:
    from fluid_build.copilot.client import LLMClient
    from fluid_build.forge.app import ForgeOutput

__all__ = [
    "forge_cassette",
    "forge_recorder",
    "missing_workspace_file",
    "recorded_intent",
    "recorded_tool_calls",
]

# Intent.summary(), read back: the recipe's message of a forge cassette.
_SUMMARY: Final = re.compile(
    r"Data product: (?P<name>\S+) \(domain (?P<domain>.*), owner (?P<owner>.*)\)\n"
    r"Description: (?P<description>.*)\nGrain: (?P<grain>.*)\n"
    r"Dimensions: (?P<dimensions>.*)\nMetrics: (?P<metrics>.*)\n"
    r"Modeling technique: (?P<technique>\S+)",
    re.DOTALL,
)


def forge_recorder(*, secrets: Sequence[str | None] = (), bodies: bool = True) -> Recorder:
    """A recorder for a forge run: every exchange, request bodies included when ``bodies``."""
    return Recorder(secrets=secrets, bodies=bodies, request_bodies=bodies)


def forge_cassette(
    recorder: Recorder,
    *,
    client: LLMClient,
    intent: Intent,
    env: Mapping[str, str],
    error: BaseException | None,
    output: ForgeOutput | None,
    waits: Sequence[float],
    agent_loop: bool = False,
    name: str | None = None,
    description: str | None = None,
    now: datetime | None = None,
) -> Cassette:
    """The cassette of a finished forge run; refuses (``CassetteError``) when a request
    got no answer, since only answers can be replayed."""
    # Without bodies, nothing of the intent is kept: not even the product's name.
    product = intent.data_product.name if recorder.bodies else "an intent"
    how = " with the agent loop" if agent_loop else ""
    recipe = CallRecipe(
        messages=[{"role": "user", "content": intent.summary()}],
        env=recipe_env(client, env),
        strict_schema=client.strict_schema,
    )
    return recorder.cassette(
        name=name or (f"forge-{product}" if recorder.bodies else "forge-run"),
        description=description
        or (
            f"A `fluid forge` run of {product}{how}: replay it with "
            "`fluid forge INTENT --replay FILE`."
        ),
        provider=client.provider,
        model=client.model,
        call=recipe,
        expect=recorder.expectation(
            error=error,
            output=output.model_dump(mode="json") if output is not None else None,
            waits=waits,
        ),
        now=now,
        forge_run=True,
    )


def recorded_intent(cassette: Cassette) -> Intent | None:
    """The intent a forge cassette was recorded with, or None when it does not hold it whole.

    :func:`forge_cassette` keeps the intent's :meth:`~Intent.summary` as the recipe's
    message, and every field of the intent is in it. It is read back, and kept only when
    it gives the very same summary again: what forge sends is then what it sent when
    recording. A cassette of another kind, redacted text, or a list item holding ``", "``
    gives None.
    """
    messages = cassette.call.messages
    text = messages[0].get("content") if len(messages) == 1 else None
    match = _SUMMARY.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return None
    try:
        intent = Intent.model_validate(
            {
                "data_product": {
                    "name": match["name"],
                    "domain": match["domain"],
                    "description": match["description"],
                    "owner": match["owner"],
                },
                "grain": match["grain"],
                "dimensions": match["dimensions"].split(", "),
                "metrics": match["metrics"].split(", "),
                "modeling_technique": match["technique"],
            }
        )
    except ValidationError:
        return None
    return intent if intent.summary() == text else None


# The workspace tools whose recorded arguments name a path, and whether it is a folder.
_PATH_ARGUMENTS: Final = {
    "read_sample_schema": ("path", False),
    "discover_workspace": ("directory", True),
}
_TOOLS: Final = frozenset({*_PATH_ARGUMENTS, "list_templates"})


def _tool_calls(value: object) -> Iterator[tuple[str, object]]:
    """(name, arguments) of every workspace tool call in an answer body, in each provider's
    shape: OpenAI ``function.arguments`` (a JSON string), Anthropic ``input``, Gemini
    ``args``."""
    if isinstance(value, list):
        for item in value:
            yield from _tool_calls(item)
        return
    if not isinstance(value, dict):
        return
    name = value.get("name")
    if isinstance(name, str) and name in _TOOLS:
        for key in ("arguments", "input", "args"):
            if key in value:
                yield name, value[key]
                break
    for item in value.values():
        yield from _tool_calls(item)


def recorded_tool_calls(cassette: Cassette) -> list[str]:
    """The workspace tools the recorded answers called, in order (a run with --agent-loop)."""
    return [
        name for exchange in cassette.exchanges for name, _ in _tool_calls(exchange.response.body)
    ]


def missing_workspace_file(cassette: Cassette, workspace: Path) -> tuple[str, str] | None:
    """The first (tool, path) a recorded tool call read that ``workspace`` does not hold.

    A replay runs the tools for real: a file the recorded run read and this workspace
    lacks makes the tool fail, and the replay differ, after the model calls before it.
    """
    for exchange in cassette.exchanges:
        for name, arguments in _tool_calls(exchange.response.body):
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    continue
            if not isinstance(arguments, dict):
                continue
            if name not in _PATH_ARGUMENTS:
                continue
            key, folder = _PATH_ARGUMENTS[name]
            path = arguments.get(key)
            if not isinstance(path, str) or path in ("", "."):
                continue
            if Path(path).is_absolute() or ".." in Path(path).parts:
                continue  # refused by the tool in any workspace: replays the same anywhere
            target = workspace / path
            if not (target.is_dir() if folder else target.is_file()):
                return name, path
    return None
