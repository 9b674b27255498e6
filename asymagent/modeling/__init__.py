"""Models: loading verifiers (HF ids, directories, the embedded GGUF) and the drafter model
that shares the verifier's embeddings and head (docs/drafter.md)."""
