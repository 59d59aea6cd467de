"""The agent loop and its tools: multi-turn calls above the client."""
