"""Context views: the drafter's full view, the verifier's compressed append-stable view, the
compressors that build it and token counting for budgets (docs/views.md)."""
