"""Strict-mode JSON schema hardening and decoding of string-encoded fields."""
