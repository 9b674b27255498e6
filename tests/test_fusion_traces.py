"""train-drafter --objective fusion on captured traces: a directory is read, a held-out slice of
conversations is kept out of training and measured, traces of another model are refused (exit 2)."""

from __future__ import annotations

import json

import pytest
import torch

from asymagent.modeling.loading import LoadedModel
from asymagent.trace_capture import tokenizer_fingerprint
from asymagent.training.config import TrainConfig
from asymagent.training.fusion_train import load_trace_conversations, run

ROWS = "\n".join(f"row {i}: order ORD-{1000 + i} status shipped weight {i * 7 % 13} kg" for i in range(24))


def _conversation(n: int) -> list:
    """Three trace lines (steps) of one agent conversation whose tool output the view compresses."""
    system = {"role": "system", "content": "You look up orders."}
    user = {"role": "user", "content": f"Which orders of customer {n} weigh most?"}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "list_orders", "arguments": json.dumps({"customer": n})}}]}
    out = {"role": "tool", "tool_call_id": "c1", "content": ROWS}
    answer = {"role": "assistant", "content": f"Customer {n}: ORD-{1005 + n} is the heaviest."}
    return [([system, user], call), ([system, user, call, out], answer)]


def _write(path, fingerprint, conversations=range(6)):
    path.mkdir(parents=True, exist_ok=True)
    with open(path / "traces-a.jsonl", "w") as f:
        for n in conversations:
            for messages, expected in _conversation(n):
                f.write(json.dumps({"messages": messages, "expected": expected,
                                    "fingerprint": fingerprint}) + "\n")


def _loaded(tokenizer):
    from conftest import make_tiny_llama

    model = make_tiny_llama(vocab_size=len(tokenizer), layers=2, hidden=32, heads=4, kv_heads=2,
                            max_positions=16384)
    gen = torch.Generator().manual_seed(3)  # an untied N(0, 1) head: rows that depend on the context
    model.lm_head.weight = torch.nn.Parameter(torch.randn((len(tokenizer), 32), generator=gen))
    return LoadedModel(model, tokenizer, "tiny-random", "sha-of-tiny")


def test_trace_directory_holdout_is_measured_not_trained(tmp_path, smollm_tokenizer):
    fp = {"tokenizer": tokenizer_fingerprint(smollm_tokenizer), "verifier": "sha-of-tiny"}
    _write(tmp_path / "traffic", fp)
    train, held = load_trace_conversations([str(tmp_path / "traffic")], 0.3, fp)
    assert len(train) + len(held) == 6 and held and train  # whole conversations, none lost
    assert not {json.dumps(m) for m, _ in held} & {json.dumps(m) for m, _ in train}
    again = load_trace_conversations([str(tmp_path / "traffic" / "traces-a.jsonl")], 0.3, fp)
    assert again == (train, held)  # a file or its directory: the same split

    cfg = TrainConfig(objective="fusion", out=str(tmp_path / "run"), max_minutes=0, max_steps=3,
                      conversations=0, traces=[str(tmp_path / "traffic")], traces_weight=1.0,
                      traces_holdout=0.3, layers=1, draft_vocab=500, eval_every=0, no_progress=True,
                      threads=1, max_context=1024, teacher_topk=8, warmup_steps=1)
    card = run(cfg, loaded=_loaded(smollm_tokenizer))
    fusion = card["fusion"]
    assert (fusion["trace_conversations"], fusion["trace_conversations_heldout"]) == (len(train), len(held))
    assert fusion["conversations_per_epoch"] == len(train)  # held-out conversations are not in the plan
    assert card["traces_heldout_positions"] > 0 and card["traces_heldout_kl_compressed"] > 0
    assert isinstance(card["traces_heldout_recovered_share"], float)
    # resuming keeps the split the run started with
    card2 = run(TrainConfig(**{**cfg.__dict__, "max_steps": 4, "resume": True, "traces_holdout": 0.0}),
                loaded=_loaded(smollm_tokenizer))
    assert card2["fusion"]["trace_conversations_heldout"] == len(held) and card2["steps"] == 4


def test_traces_of_another_verifier_are_refused_with_exit_2(tmp_path, capsys, smollm_tokenizer):
    from asymagent.integrations.cli import main

    _write(tmp_path / "traffic", {"tokenizer": tokenizer_fingerprint(smollm_tokenizer), "verifier": "0" * 64})
    code = main(["train-drafter", "--objective", "fusion", "--traces", str(tmp_path / "traffic"),
                 "--out", str(tmp_path / "run"), "--max-steps", "1", "--conversations", "0",
                 "--no-progress", "--threads", "1"])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]  # not the load bars
    assert code == 2 and len(errors) == 1
    assert errors[0].startswith("asymagent train-drafter: error: trace ")
    assert "was captured with verifier sha256 0000000000000000" in errors[0]


def test_a_bad_trace_line_is_refused_before_any_model_loads(tmp_path, capsys):
    from asymagent.integrations.cli import main

    (tmp_path / "traffic").mkdir()
    (tmp_path / "traffic" / "t.jsonl").write_text('{"messages": []}\n')
    with pytest.raises(SystemExit) as exc:
        main(["train-drafter", "--objective", "fusion", "--traces", str(tmp_path / "traffic"),
              "--out", str(tmp_path / "run"), "--max-steps", "1"])
    assert exc.value.code == 2 and "t.jsonl:1: invalid trace" in capsys.readouterr().err
