"""The LLM layer of fluid_build: provider calls, retries and agents."""
