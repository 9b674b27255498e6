"""A long synthetic tool-heavy agent conversation, and the default config's compression on it.

`agent_conversation(steps, seed)` is shared with the other view tests (and the engine-level
test): a system prompt, five tools, a user task, then `steps` rounds of assistant tool call +
tool output (JSON search results, log excerpts, file listings, 150-1200 tokens each), like the
traces of a coding/research agent. Run with `-s` to print the measured ratios.
"""

from __future__ import annotations

import json
import random

import pytest

from asymagent.context.views import CompressionConfig, ContextViews

TOOLS = [
    {"type": "function", "function": {
        "name": "search_docs", "description": "Full-text search over the project documentation.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Search terms"},
            "limit": {"type": "integer", "description": "Maximum results"}}, "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a text file from the repository.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the repository root"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "run_tests", "description": "Run the test suite and return the log.",
        "parameters": {"type": "object", "properties": {
            "target": {"type": "string", "description": "Test file or directory"},
            "verbose": {"type": "boolean"}}, "required": []}}},
    {"type": "function", "function": {
        "name": "list_orders", "description": "List customer orders with their status.",
        "parameters": {"type": "object", "properties": {
            "customer_id": {"type": "integer"}, "status": {"enum": ["open", "shipped", "late"]}},
            "required": ["customer_id"]}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email to a customer.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
            "required": ["to", "subject", "body"]}}},
]

_WORDS = ("cache prefix verifier drafter token context budget latency request queue worker "
          "shard index record status order customer invoice shipment parcel warehouse retry "
          "timeout error handler module function class config option default value").split()


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n)).capitalize() + "."


def _tool_output(rng: random.Random, name: str, size: int) -> str:
    if name == "search_docs":
        hits = [{"title": _sentence(rng, 4), "path": f"docs/{rng.choice(_WORDS)}_{i}.md",
                 "score": round(rng.random(), 3), "snippet": _sentence(rng, 18)} for i in range(size)]
        return json.dumps({"results": hits, "total": size * 7})
    if name == "read_file":
        lines = [f"def {rng.choice(_WORDS)}_{i}(x, y={rng.randint(0, 99)}):\n    return {_sentence(rng, 6)!r}"
                 for i in range(size)]
        return "\n".join(lines)
    if name == "run_tests":
        lines = [f"tests/test_{rng.choice(_WORDS)}.py::test_{rng.choice(_WORDS)}_{i} "
                 f"{'PASSED' if rng.random() > 0.1 else 'FAILED'} [{i * 100 // size}%]" for i in range(size)]
        return "\n".join(lines + [f"== {size - 2} passed, 2 failed in {rng.random() * 9:.2f}s =="])
    orders = [{"order_id": 10000 + i, "status": rng.choice(["open", "shipped", "late"]),
               "items": [{"sku": f"SKU-{rng.randint(100, 999)}", "qty": rng.randint(1, 5)}],
               "note": _sentence(rng, 8)} for i in range(size)]
    return json.dumps({"customer_id": 42, "orders": orders})


def agent_conversation(steps: int, seed: int = 0) -> list:
    """[system, user, (assistant call, tool output) * steps]: a tool-heavy agent trace."""
    rng = random.Random(seed)
    messages = [
        {"role": "system", "content": "You are a careful engineering agent. Use the tools to "
                                      "answer; cite file paths and numbers exactly."},
        {"role": "user", "content": "Customer 42 says an order is late and tests are failing. "
                                    "Find out why, check the docs, and email them a summary."},
    ]
    sizes = {"search_docs": (4, 14), "read_file": (8, 40), "run_tests": (15, 60), "list_orders": (3, 12)}
    for step in range(steps):
        name = rng.choice(list(sizes))
        args = {"search_docs": {"query": _sentence(rng, 3), "limit": 10},
                "read_file": {"path": f"src/{rng.choice(_WORDS)}.py"},
                "run_tests": {"target": "tests/", "verbose": True},
                "list_orders": {"customer_id": 42, "status": "late"}}[name]
        call_id = f"call_{seed}_{step}"
        thought = _sentence(rng, 10) if rng.random() < 0.5 else None
        messages.append({"role": "assistant", "content": thought, "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}]})
        messages.append({"role": "tool", "tool_call_id": call_id,
                         "content": _tool_output(rng, name, rng.randint(*sizes[name]))})
    return messages


def run_views(views: ContextViews, messages: list, tools=TOOLS) -> list:
    """Build the views step by step (at each point the agent would generate): [ViewPair]."""
    points = [i for i, m in enumerate(messages) if m["role"] in ("user", "tool")]
    return [views.build(messages[: i + 1], tools) for i in points]


def prefill_totals(pairs: list) -> int:
    """Tokens the verifier prefills over the run when each build reuses the longest common
    prefix with the previous view (what the engine's cache does)."""
    total, prev = 0, []
    for pair in pairs:
        ids = pair.compressed_ids
        common = 0
        for a, b in zip(prev, ids):
            if a != b:
                break
            common += 1
        total += len(ids) - common
        prev = ids
    return total


@pytest.fixture(scope="module")
def conversation():
    return agent_conversation(30, seed=1)


def test_default_config_compresses_a_tool_heavy_context_append_only(smollm_tokenizer, conversation):
    views = ContextViews(smollm_tokenizer, CompressionConfig.default())
    pairs = run_views(views, conversation)
    final = pairs[-1]
    prefilled = prefill_totals(pairs)
    print(f"\ndefault, 30-step agent run: full {final.full_context_tokens} tokens, verifier "
          f"{final.verifier_context_tokens}, ratio {final.compression_ratio:.3f}, verifier prefill "
          f"over the run {prefilled} ({prefilled / final.verifier_context_tokens:.2f}x final), "
          f"rewrites {views.total_rewrites}")
    assert final.full_context_tokens > 10_000  # the trace really is long and tool-heavy
    # The bound: a tool-output-heavy context cut to at most half (goal ~0.3; 0.25 seen).
    assert final.compression_ratio <= 0.5
    # Append-only: no rewrite, so over the whole run the verifier prefills each token once.
    assert views.total_rewrites == 0
    assert prefilled == final.verifier_context_tokens


def test_recent_turns_rewrites_are_batched_and_counted(smollm_tokenizer, conversation):
    config = CompressionConfig(compressors=["tool_output", {"type": "recent_turns",
                                                            "keep_turns": 3, "demote_every": 6}])
    views = ContextViews(smollm_tokenizer, config)
    pairs = run_views(views, conversation)
    final = pairs[-1]
    prefilled = prefill_totals(pairs)
    print(f"tool_output+recent_turns(3, 6): ratio {final.compression_ratio:.3f}, verifier prefill "
          f"{prefilled} ({prefilled / final.verifier_context_tokens:.2f}x final), "
          f"rewrites {views.total_rewrites}")
    # Demoting old tool outputs to stubs shrinks the final view further than tool_output alone.
    assert final.compression_ratio < 0.25
    # Turns: the user message is turn 0, each assistant call starts a new one, so the build at
    # step s (s = 1..30) sees s+1 turns. The frontier moves when turns - 3 reaches 6, 12, 18,
    # 24, i.e. at turn counts 9, 15, 21, 27: exactly 4 rewrites, one per 6 steps.
    assert views.total_rewrites == 4
    assert [p.rewrites for p in pairs].count(1) == 4
    for before, after in zip(pairs, pairs[1:]):
        if not after.rewrites:  # between rewrites the view only grows
            body = before.compressed_ids[: len(before.compressed_ids) - before.generation_prompt_len]
            assert after.compressed_ids[: len(body)] == body


CONFIGS = {  # the table in docs/views.md
    "none": [],
    "tool_output (default)": ["tool_output"],
    "tool_output 32/16": [{"type": "tool_output", "head_tokens": 32, "tail_tokens": 16}],
    "tool_output + tool_schemas": ["tool_output", "tool_schemas"],
    "tool_output + recent_turns(3, 3)": ["tool_output", {"type": "recent_turns", "keep_turns": 3,
                                                          "demote_every": 3}],
    "tool_output + recent_turns(3, 6)": ["tool_output", "recent_turns"],
    "tool_output + recent_turns(2, 10)": ["tool_output", {"type": "recent_turns", "keep_turns": 2,
                                                           "demote_every": 10}],
}


def main(steps: int = 30, seed: int = 1) -> None:
    """Print the compression table: `python tests/test_views_synthetic.py`."""
    from asymagent.chat.chat_format import ChatFormat
    from asymagent.modeling.loading import load_default_verifier

    fmt = ChatFormat(load_default_verifier().tokenizer)
    messages = agent_conversation(steps, seed)
    print("| config | final ratio | mean ratio over steps | verifier prefill / final | rewrites |")
    print("|---|---|---|---|---|")
    for name, compressors in CONFIGS.items():
        views = ContextViews(compression={"compressors": compressors}, chat_format=fmt)
        pairs = run_views(views, messages)
        final = pairs[-1]
        mean = (sum(p.verifier_context_tokens for p in pairs)
                / sum(p.full_context_tokens for p in pairs))
        prefilled = prefill_totals(pairs)
        print(f"| {name} | {final.compression_ratio:.3f} ({final.verifier_context_tokens}/"
              f"{final.full_context_tokens}) | {mean:.3f} | {prefilled} "
              f"({prefilled / final.verifier_context_tokens:.2f}x) | {views.total_rewrites} |")


if __name__ == "__main__":
    main()
