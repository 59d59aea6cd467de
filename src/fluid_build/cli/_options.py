"""Options several ``fluid`` commands share, spelled and explained once."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import click

if TYPE_CHECKING:
    from fluid_build.copilot.call.core import CallOptions

__all__ = ["call_options", "call_options_given", "model_option", "provider_option"]

F = TypeVar("F", bound=Callable[..., Any])

#: ``--provider``: left out, the environment says (fluid batch, fluid forge).
provider_option = click.option(
    "--provider",
    help="openai, azure, anthropic, gemini, ollama, ... (default: from the environment)",
)

#: ``--model``: left out, FLUID_LLM_MODEL or the provider's default.
model_option = click.option(
    "--model", help="The model (default: FLUID_LLM_MODEL or the provider's default)."
)

_SEED_BOUND: Final = 2**63


class _Temperature(click.ParamType[float]):
    """A finite number from 0 to 2 (``click.FloatRange`` lets ``nan`` through)."""

    name = "FLOAT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, float) and math.isfinite(value) and 0.0 <= value <= 2.0:
            return value
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and 0.0 <= number <= 2.0):
            self.fail(f"{value!r} is not a number from 0 to 2, e.g. 0.2", param, ctx)
        return number


class _Seed(click.ParamType[int]):
    """A whole number that fits in 64 bits, as every provider that takes a seed reads it."""

    name = "INTEGER"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            try:
                number = int(str(value).strip(), 10)
            except ValueError:
                self.fail(f"{value!r} is not a whole number, e.g. 42", param, ctx)
        if not -_SEED_BOUND <= number < _SEED_BOUND:
            self.fail(f"{value!r} does not fit in 64 bits (a signed 64-bit integer)", param, ctx)
        return number


def call_options(command: F) -> F:
    """``--max-output-tokens``, ``--temperature`` and ``--seed``: sent with every call the
    command makes, over FLUID_LLM_MAX_OUTPUT_TOKENS and FLUID_LLM_TEMPERATURE."""
    for option in reversed(
        (
            click.option(
                "--max-output-tokens",
                type=click.IntRange(min=1),
                default=None,
                help="The most tokens each answer may take (default: "
                "FLUID_LLM_MAX_OUTPUT_TOKENS, else the provider's).",
            ),
            click.option(
                "--temperature",
                type=_Temperature(),
                default=None,
                help="Sampling temperature, 0 to 2, for every call (default: "
                "FLUID_LLM_TEMPERATURE, else the provider's).",
            ),
            click.option(
                "--seed",
                type=_Seed(),
                default=None,
                help="A seed for providers that take one (OpenAI, Gemini, Ollama); "
                "refused where the provider has none.",
            ),
        )
    ):
        command = option(command)
    return command


def call_options_given(
    max_output_tokens: int | None, temperature: float | None, seed: int | None
) -> CallOptions:
    """The call options the flags set, as ``complete()`` takes them; an unset flag is
    absent, so the client's default (the environment's) applies to it."""
    given: CallOptions = {}
    if max_output_tokens is not None:
        given["max_output_tokens"] = max_output_tokens
    if temperature is not None:
        given["temperature"] = temperature
    if seed is not None:
        given["seed"] = seed
    return given
