"""The stages of one call, in order: capabilities and pre-flight, the retry envelope, the wire."""
