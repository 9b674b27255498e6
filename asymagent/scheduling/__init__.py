"""Continuous batching: admission of requests decoding at once and the gathering of their forwards."""
