"""Old import path of the compressors (moved to asymagent.context.compressors); kept as a re-export."""

from asymagent.context.compressors import *  # noqa: F401,F403
from asymagent.context.compressors import CompressionConfig  # noqa: F401
