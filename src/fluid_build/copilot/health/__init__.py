"""Shared health of one key: cooldown windows, the circuit breaker, and the stores they live in."""
