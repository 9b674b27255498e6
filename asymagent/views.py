"""Old import path of the context views (moved to asymagent.context.views); kept as a re-export."""

from asymagent.context.views import *  # noqa: F401,F403
from asymagent.context.views import CompressionConfig, ContextViews, ViewPair  # noqa: F401
