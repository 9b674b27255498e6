"""Training: drafter distillation (`asymagent train-drafter`) and its local synthetic data
(docs/drafter.md)."""
