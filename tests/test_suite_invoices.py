"""The invoices suite (evals/suites/suite_invoices.py): invoices laid out as invoices are, and the default view cuts their middle from the second model turn on."""

from __future__ import annotations

import re

import pytest

from asymagent.evals.suites.environments import make_env, oracle_episode

SEEDS = (0, 1, 2, 3, 100_000)


@pytest.mark.parametrize("seed", SEEDS)
def test_an_invoice_opens_with_its_vendor_and_ends_with_the_sum_of_its_lines(seed):
    env = make_env("invoices")
    env.reset(seed)
    assert 3 <= len(env.docs) <= 4
    for doc_id, doc in env.docs.items():
        lines = doc["text"].splitlines()
        assert lines[0] == f"Invoice {doc_id} from {doc['vendor']}"
        items = [line for line in lines if re.match(r"\d+\. ", line)]
        assert 5 <= len(items) <= 8
        cents = 0
        for line in items:
            qty, unit, amount = re.search(r": (\d+) x ([\d.]+) EUR = ([\d.]+) EUR$", line).groups()
            assert round(int(qty) * float(unit) * 100) == round(float(amount) * 100)
            cents += round(float(amount) * 100)
        assert lines[-1] == f"Invoice total: {cents / 100:.2f} EUR" and doc["amount"] == cents / 100


def test_recording_a_wrong_amount_or_a_wrong_sum_is_not_success():
    env = make_env("invoices")
    _, history = oracle_episode(env, 0)
    answer = history[-1]["content"]
    plan = env.oracle_plan()
    env.reset(0)
    for step in plan:
        args = dict(step["arguments"])
        if step["name"] == "record_invoice" and step is plan[1]:
            args["amount"] = round(args["amount"] + 1, 2)
        env.step(step["name"], args)
    assert env.check_answer(answer) and not env.check_success(answer)
    env.reset(0)
    for step in plan:
        env.step(step["name"], step["arguments"])
    assert env.check_success(answer) and not env.check_success(answer.replace(env._total, "1.00"))


@pytest.mark.parametrize("seed", (0, 1, 2, 3))
def test_the_default_view_cuts_each_invoice_from_the_second_turn_and_keeps_vendor_and_total(seed, smollm_tokenizer):
    """The verifier's default view is shorter than the full history from the turn after the first
    document, and what it keeps of a document still names the vendor and the total the task records."""
    from asymagent.context.views import ContextViews
    from asymagent.integrations.calculator_tool import calculator_tool
    from asymagent.integrations.demo_free import answer_tool

    env = make_env("invoices")
    task, history = oracle_episode(env, seed)
    tools = list(task.tools) + [calculator_tool(), answer_tool()]  # as the demo offers them
    views = ContextViews(smollm_tokenizer, None)  # the default view
    first = views.build(history[:2], tools)
    assert first.verifier_context_tokens == first.full_context_tokens  # nothing to cut yet
    for end in range(4, len(history), 2):  # after each tool output: model turns 2, 3, ...
        pair = views.build(history[:end], tools)
        assert pair.verifier_context_tokens < pair.full_context_tokens, end
    assert pair.compression_ratio < 0.85
    read = [e for e in views.entries if e.role == "tool" and e.tool_name == "read_document"]
    assert len(read) == len(env.docs)
    for entry in read:
        doc = next(d for d in env.docs.values() if d["text"] == entry.original)
        assert "tokens omitted" in entry.compressed_text
        assert doc["vendor"] in entry.compressed_text
        assert f"Invoice total: {doc['amount']:.2f} EUR" in entry.compressed_text
