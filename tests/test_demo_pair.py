"""The free-running demo on the reference pair (`make demo`'s path): two turns of its episode in both modes; skipped without the pair's parts."""

from __future__ import annotations

import pytest
from conftest import pair_marks

pytestmark = pair_marks()


def test_two_free_running_turns_of_the_pairs_episode_in_both_modes():
    from asymagent.engine import Engine
    from asymagent.integrations.demo import PAIR_EPISODE
    from asymagent.integrations.demo_free import run_side_by_side
    from asymagent.model_banner import model_banner

    engine = Engine.from_pair("qwen2.5-coder")
    text = model_banner(engine).text()
    assert "pair qwen2.5-coder" in text and "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" in text
    asym, full = run_side_by_side(engine, *PAIR_EPISODE, ("asym", "full"), max_new_tokens=48,
                                  max_turns=2)
    for episode in (asym, full):
        assert len(episode.steps) == 2 and episode.done
        assert isinstance(episode.steps[0]["action"], dict)  # the model's own first call...
        assert episode.calls >= 1 and episode.env.calls  # ...ran in the environment
    # turn 2 reads the first tool output, an invoice whose line items the default view cuts:
    # full's verifier reads the whole history, asym's a compressed view of it (before, on the
    # injection episode, asym cut nothing anywhere: docs/log.md, "The demo's view at work")
    a2, f2 = asym.steps[1]["stats"], full.steps[1]["stats"]
    assert f2.verifier_context_tokens == f2.full_context_tokens
    assert a2.verifier_context_tokens < a2.full_context_tokens
