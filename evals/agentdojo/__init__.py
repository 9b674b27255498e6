"""`asymagent eval agentdojo`: AgentDojo's suites, tools and scoring with the engine as the agent's LLM (docs/evals.md, "AgentDojo")."""
