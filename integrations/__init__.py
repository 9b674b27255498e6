"""Every face of asymagent: CLI, OpenAI-compatible server, LangChain/LangGraph (asymagent.integrations)."""
