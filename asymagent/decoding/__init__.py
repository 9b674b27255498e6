"""Decoding: the speculative round, drafters behind one two-method interface, sampling, adaptive K,
stopping, constraints and FLOPs accounting (docs/architecture.md)."""
