"""evals/probes/cut_row_rank.py on tiny random models: the rows the default view cuts from earlier
outputs, each ranked by the drafter's attention and surprise, and whether lexical re-admission
brings the marked row back (the figures docs/pair.md quotes come from the pair's run)."""

from __future__ import annotations

from asymagent.engine import Engine
from asymagent.evals.probes.cut_row_rank import rank_step
from test_lexical_readmit import _handbook, _ticket


def test_ranks_the_cut_rows_of_earlier_outputs_and_finds_the_marked_one(smollm_tokenizer):
    from conftest import make_tiny_llama

    model = make_tiny_llama(vocab_size=49152, layers=1, hidden=64, seed=3, max_positions=4096)
    engine = Engine(verifier=model, drafter=model, tokenizer=smollm_tokenizer)
    messages = _handbook() + _ticket(1, "Ticket T-7: checkout fails\nComponent: component-ex")
    out = rank_step(engine, messages, None, ["component-ex -> team Heron"], rows=64, budget=64)
    assert out["cut_rows"] >= 8 and out["cut_tokens"] > 0
    assert out["compressed_tokens"] < out["full_tokens"] and out["newest_block_tokens"] > 0
    by_signal = {m["signal"]: m for m in out["marked"]}
    assert set(by_signal) == {"attention", "attention_L0-0", "attention_best_layer", "surprise", "lexical"}
    for signal in ("attention", "attention_L0-0", "attention_best_layer", "surprise"):
        m = by_signal[signal]
        assert 0 <= m["rank"] < out["cut_rows"] and 0 <= m["cut_tokens_above"] < out["cut_tokens"]
    # one layer: its band, its best layer and the mean over layers are the same ranking
    assert by_signal["attention_L0-0"]["rank"] == by_signal["attention"]["rank"] == by_signal["attention_best_layer"]["rank"]
    assert out["lookahead_text"] == ""  # no look-ahead asked
    assert by_signal["lexical"]["brought_back"] is True  # the ticket names its component
    missing = rank_step(engine, messages, None, ["no such row"], rows=64)
    assert missing["marked"] == []


def test_look_ahead_rows_and_layer_bands_rank_the_marked_row(smollm_tokenizer):
    from conftest import make_tiny_llama

    model = make_tiny_llama(vocab_size=49152, layers=4, hidden=64, seed=5, max_positions=4096)
    engine = Engine(verifier=model, drafter=model, tokenizer=smollm_tokenizer)
    messages = _handbook() + _ticket(1, "Ticket T-7: checkout fails\nComponent: component-ex")
    out = rank_step(engine, messages, None, ["component-ex -> team Heron"], rows=64, lookahead=5)
    assert out["depth"] == 4
    signals = {m["signal"] for m in out["marked"]}
    for prefix in ("attention", "lookahead"):  # every layer, the four quarters, the first half, the best layer
        assert {prefix, f"{prefix}_L0-0", f"{prefix}_L1-1", f"{prefix}_L2-2", f"{prefix}_L3-3",
                f"{prefix}_L0-1", f"{prefix}_best_layer"} <= signals
    best = {m["signal"]: m for m in out["marked"] if m["signal"].endswith("_best_layer")}
    for prefix in ("attention", "lookahead"):
        layer_ranks = [m["rank"] for m in out["marked"] if m["signal"] in {f"{prefix}_L{i}-{i}" for i in range(4)}]
        assert best[f"{prefix}_best_layer"]["rank"] == min(layer_ranks) and 0 <= best[f"{prefix}_best_layer"]["layer"] < 4
    assert out["lookahead_text"] != ""  # a random model's greedy tokens (up to 5, EOS ends them sooner)
