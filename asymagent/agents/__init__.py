"""Agents: the agent loop over an Engine and the `@tool` tools it calls (docs/agent.md)."""
