"""Options several ``fluid`` commands share, spelled and explained once."""

from __future__ import annotations

import click

__all__ = ["model_option", "provider_option"]

#: ``--provider``: left out, the environment says (fluid batch, fluid forge).
provider_option = click.option(
    "--provider",
    help="openai, azure, anthropic, gemini, ollama, ... (default: from the environment)",
)

#: ``--model``: left out, FLUID_LLM_MODEL or the provider's default.
model_option = click.option(
    "--model", help="The model (default: FLUID_LLM_MODEL or the provider's default)."
)
