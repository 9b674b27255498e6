"""Running evals: `asymagent eval` (CLI, runner, episodes, the episode log, Ray actors), the token-level fusion eval, and engine/drafter selection."""
