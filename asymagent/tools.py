"""Old import path of the agent tools (moved to asymagent.agents.tools); kept as a re-export."""

from asymagent.agents.tools import *  # noqa: F401,F403
from asymagent.agents.tools import Tool, as_tool, schema_errors, tool  # noqa: F401
