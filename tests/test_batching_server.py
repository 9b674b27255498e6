"""`asymagent serve` with continuous batching: concurrent streamed requests are generated at once
(their streams interleave), each answer the same as the one-at-a-time server's, and /metrics
shows the batch sizes. Real uvicorn on 127.0.0.1, tiny random bf16 models (the engine's batched
CPU path) with the real SmolLM2 tokenizer."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from test_server import VOCAB, serving

from asymagent.integrations.server import create_app
from asymagent.modeling.packed_linear import kernel_available
from conftest import make_tiny_llama

pytestmark = pytest.mark.skipif(kernel_available() is not None,
                                reason=f"no packed bf16 linear kernel: {kernel_available()}")
N = 4


def _engine(tokenizer, max_num_seqs: int):
    from asymagent.engine import Engine

    verifier = make_tiny_llama(vocab_size=VOCAB, hidden=64, seed=0).to(torch.bfloat16)
    drafter = make_tiny_llama(vocab_size=VOCAB, hidden=64, layers=1, seed=1).to(torch.bfloat16)
    return Engine(verifier=verifier, drafter=drafter, tokenizer=tokenizer,
                  max_num_seqs=max_num_seqs)


def _stream(url: str, i: int) -> tuple:
    """One streamed chat; (text, [arrival times of its chunks])."""
    body = {"model": "asymagent", "stream": True, "max_tokens": 48, "mode": ("asym", "full", "spec")[i % 3],
            "messages": [{"role": "user", "content": f"Tell me about city number {i}."}],
            "temperature": 0.7 if i % 2 else 0.0, "seed": 5 + i}
    text, times = "", []
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            times.append(time.monotonic())
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                text += delta[0]["delta"]["content"]
    return text, times


def test_streams_interleave_and_answers_are_the_same_as_alone(smollm_tokenizer):
    with serving(create_app(_engine(smollm_tokenizer, 1), max_queue=8)) as url:
        alone = [_stream(url, i)[0] for i in range(N)]
    engine = _engine(smollm_tokenizer, N)
    with serving(create_app(engine, max_queue=8)) as url:
        with ThreadPoolExecutor(N) as pool:
            together = list(pool.map(lambda i: _stream(url, i), range(N)))
        metrics = httpx.get(url + "/metrics").text
    assert [t for t, _ in together] == alone
    spans = [(times[0], times[-1]) for _, times in together if len(times) > 1]
    assert len(spans) >= 2
    # some stream sent a chunk while another one was between its first and last chunk
    assert any(a[0] < b[1] and b[0] < a[1] for j, a in enumerate(spans) for b in spans[j + 1:])
    batched = [line for line in metrics.splitlines()
               if line.startswith("asymagent:iteration_sequences_bucket") and 'le="1.0"' in line]
    total = [line for line in metrics.splitlines()
             if line.startswith("asymagent:iteration_sequences_count")]
    assert batched and total and float(total[0].split()[-1]) > float(batched[0].split()[-1]), \
        "no forward batched more than one sequence"


def test_chat_model_batch_and_abatch_run_at_once_with_the_same_answers(smollm_tokenizer):
    """ChatAsymSpec.batch / abatch on an engine with max_num_seqs > 1: the inputs decode at once
    (forwards of several sequences), each answer the one-at-a-time engine's."""
    import asyncio

    from asymagent.integrations.langchain import ChatAsymSpec

    prompts = [f"Name a colour, number {i}." for i in range(N)]
    one = ChatAsymSpec(engine=_engine(smollm_tokenizer, 1), max_tokens=16, mode="spec")
    alone = [m.content for m in one.batch(prompts)]
    engine = _engine(smollm_tokenizer, N)
    sizes: list = []
    engine.scheduler.batcher.observers.append(lambda seqs, rows: sizes.append(seqs))
    model = ChatAsymSpec(engine=engine, max_tokens=16, mode="spec")
    assert [m.content for m in model.batch(prompts)] == alone
    assert max(sizes) > 1
    sizes.clear()
    assert [m.content for m in asyncio.run(model.abatch(prompts))] == alone
    assert max(sizes) > 1
