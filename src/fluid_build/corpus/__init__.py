"""Cassettes: recorded provider exchanges, their format, record and replay."""
