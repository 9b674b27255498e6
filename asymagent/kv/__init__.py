"""KV caches: per-view cache bookkeeping (prefix reuse, crop, sessions), the growing cache and the
GQA-aware attention used by multi-token verify forwards (docs/architecture.md)."""
