"""Running a cassette's recipe through the real client, on a clock the caller holds.

Recording and replay run a recipe the same way: an
:class:`~fluid_build.copilot.client.LLMClient` whose retry envelope has no
jitter and sleeps on the given :class:`Clock` (so a replay waits exactly what
the recording waited), with an in-memory cooldown, driven as the recipe says
(``complete``, ``stream`` or the agent loop).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import httpx
from pydantic import BaseModel

from fluid_build.corpus.cassette import CallRecipe, resolve_response_model
from fluid_build.corpus.compare import ReplayMismatch

if TYPE_CHECKING:
    from fluid_build.copilot.call.core import CallOptions
    from fluid_build.copilot.call.envelope import RetryEvent
    from fluid_build.copilot.client import LLMClient

__all__ = ["Clock", "recipe_client", "run_recipe"]


class Clock(Protocol):
    """Wall-clock seconds and sleeps, keeping every wait asked for in :attr:`waits`."""

    waits: list[float]

    def __call__(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...
    async def asleep(self, seconds: float) -> None: ...


def _no_jitter() -> float:
    return 0.0  # backoffs are exact, so a replay waits what the recording waited


def _quiet(event: RetryEvent) -> None:
    return None


def recipe_client(
    *,
    provider: str,
    model: str,
    api_key: str | None,
    env: Mapping[str, str],
    strict_schema: bool,
    capability_matrix: Mapping[str, Any] | None = None,
    clock: Clock,
    http: httpx.Client,
    ahttp: httpx.AsyncClient | None = None,
    base_url: str | None = None,
) -> LLMClient:
    """An :class:`LLMClient` on ``clock``: no jitter, no retry log, an in-memory cooldown."""
    from fluid_build.copilot.call.envelope import RetryEnvelope, RetryPolicy
    from fluid_build.copilot.client import LLMClient
    from fluid_build.copilot.health.store import MemoryCooldownStore

    envelope = RetryEnvelope(
        RetryPolicy.from_env(env),
        cooldown=MemoryCooldownStore(),
        hook=_quiet,
        clock=clock,
        sleep=clock.sleep,
        asleep=clock.asleep,
        random=_no_jitter,
    )
    return LLMClient(
        provider,
        model,
        api_key,
        base_url,
        envelope=envelope,
        http_client=http,
        async_http_client=ahttp,
        env=env,
        strict_schema=strict_schema,
        capability_matrix=capability_matrix,
    )


def _as_json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def run_recipe(client: LLMClient, recipe: CallRecipe, clock: Clock) -> Any:
    """Run ``recipe`` on ``client``: the validated output as JSON (without a model, the text)."""
    model = resolve_response_model(recipe.response_model) if recipe.response_model else None
    # The recipe's options as the recorded caller passed them; one not set is left out.
    sampling = recipe.options()
    options = cast("CallOptions", {"system": recipe.system, "response_model": model, **sampling})
    if recipe.kind == "complete":
        done = client.complete(recipe.messages, **options)
        return _as_json(done.parsed if model is not None else done.text)
    if recipe.kind == "stream":
        events: Iterator[Any] = client.stream(recipe.messages, **options)
        completion = None
        for event in events:
            if event.type == "done":
                completion = event.completion
        if completion is None:
            raise ReplayMismatch("the stream ended without its done event")
        return _as_json(completion.parsed if model is not None else completion.text)
    from fluid_build.copilot.loop.agent import AgentLoop

    sampling.pop("max_output_tokens", None)  # the loop's own argument
    loop = AgentLoop(
        client,
        response_model=model,
        system=recipe.system,
        max_output_tokens=recipe.max_output_tokens,
        clock=clock,
        env=recipe.env,
        options=cast("CallOptions", sampling),
    )
    result = loop.run(str(recipe.messages[0]["content"]))
    return _as_json(result.output)
