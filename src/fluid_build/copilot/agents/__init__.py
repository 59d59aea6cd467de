"""Stage agents: typed errors, classification, the retry envelope and the agent loop."""
