"""Old import path of the drafter model (moved to asymagent.modeling.drafter); kept as a re-export."""

from asymagent.modeling.drafter import *  # noqa: F401,F403
from asymagent.modeling.drafter import (  # noqa: F401
    DEFAULT_CARD_FILE,
    DEFAULT_DRAFTER_FILE,
    DrafterMismatchError,
    build_drafter,
    load_default_drafter,
    load_drafter,
    save_drafter,
)
