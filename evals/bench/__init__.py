"""`asymagent bench`: the side-by-side benchmark, its HF peers, and the markdown/PNG reports (docs/results.md)."""
