"""Chat: OpenAI-style messages to token segments and back (chat format, output parsing), the
tool-call constraint, and the chat session that `Engine.chat` runs (docs/agent.md)."""
