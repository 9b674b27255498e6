"""Long-horizon agent eval suites, runners, reports and the side-by-side bench (asymagent.evals)."""
