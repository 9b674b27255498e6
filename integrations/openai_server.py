"""The old import path of the server's app factory (`create_app`): the server is the package `integrations/server/` now.

Kept because `integrations/serve.py` and users (docs/serving.md, CHANGELOG) import
`asymagent.integrations.openai_server.create_app`; new code imports `asymagent.integrations.server`.
"""

from asymagent.integrations.serve_setup import check_args, load_engine  # noqa: F401  (old paths)
from asymagent.integrations.server.app import (  # noqa: F401
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_NAME, create_app)
from asymagent.integrations.server.chat import cache_key_for  # noqa: F401
