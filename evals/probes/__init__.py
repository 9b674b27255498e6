"""One-off measurements and probes (`python -m asymagent.evals.probes.<name>`): KV, latency, profiles, threads, coupling, copied drafts, drafter, GPU, determinism."""
