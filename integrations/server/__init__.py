"""The OpenAI-compatible server as a package of handlers: one module per endpoint over a shared serving context.

`create_app(engine, ...)` (app.py) wires them; `asymagent serve` (integrations/serve.py) runs it.
"""

from asymagent.integrations.server.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_NAME, create_app

__all__ = ["create_app", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_MODEL_NAME"]
