"""The final-answer grader counts every value of the oracle's answer, not only words with digits."""

from asymagent.evals.suites.answer_values import answer_ok, answer_values, carries_values, history_parts
from asymagent.evals.suites.environments import SUITES, make_env, oracle_episode

HISTORY = [
    {"role": "system", "content": "You are a logistics assistant."},
    {"role": "user", "content": "Where is shipment 1Z162Y86088 going? Tell me its destination and status."},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function", "function": {
        "name": "get_shipment", "arguments": "{\"tracking_no\": \"1Z162Y86088\"}"}}]},
    {"role": "tool", "tool_call_id": "c0", "name": "get_shipment",
     "content": '{"tracking_no": "1Z162Y86088", "destination": "Cebu", "status": "delivered", "weight_kg": 23.13}'},
]
EXPECTED = "Shipment 1Z162Y86088 goes to Cebu; it was delivered and weighs 23.13 kg."


def test_a_place_without_digits_counts():
    assert answer_ok(EXPECTED, "1Z162Y86088 is headed to Cebu, delivered, 23.13 kg.", HISTORY)
    assert not answer_ok(EXPECTED, "1Z162Y86088 is headed to Quito, delivered, 23.13 kg.", HISTORY)
    assert not answer_ok(EXPECTED, "1Z162Y86088 is headed to Cebu, 23.13 kg.", HISTORY)  # status missing


def test_digits_still_count_as_whole_words():
    assert not answer_ok(EXPECTED, "1Z162Y86088 goes to Cebu, delivered, 23.14 kg.", HISTORY)
    assert not answer_ok(EXPECTED, "1Z162Y8608 goes to Cebu, delivered, 23.13 kg.", HISTORY)
    assert not carries_values("15 tickets assigned", ["5"])  # "5" is not carried by "15"
    assert carries_values("5 tickets assigned", ["5"])
    assert carries_values("It weighs 23.13kg", ["23.13"])  # a short unit glued to a number
    assert carries_values("a total of 1,234.50 EUR", ["1234.50", "eur"])  # thousands separator
    assert carries_values("change -5.2%", ["-5.2"]) and not carries_values("change 5.2%", ["-5.2"])  # sign


def test_case_and_punctuation_tolerance():
    assert answer_ok(EXPECTED, "SHIPMENT 1z162y86088 -> cebu (DELIVERED), 23.13.", HISTORY)
    assert answer_ok(EXPECTED, "Destination: **Cebu**. Status: delivered. Tracking: `1Z162Y86088`; 23.13", HISTORY)


def test_values_are_derived_from_the_episode_not_from_the_wording():
    request, outputs = history_parts(HISTORY)
    values = answer_values(EXPECTED, request, outputs)
    # request words ("shipment", "destination", "status"), stopwords and template words are not values
    assert values == ["1z162y86088", "cebu", "delivered", "23.13"]
    assert answer_ok(EXPECTED, "It was delivered: 1Z162Y86088, Cebu, 23.13.", HISTORY)


def test_every_suite_oracle_answer_passes_and_a_swapped_value_fails():
    for suite in SUITES:
        env = make_env(suite)
        _, history = oracle_episode(env, 100_000)
        answer = history[-1]["content"]
        assert env.check_answer(answer), suite
        assert env.answer_values(), suite
        for value in env.answer_values():
            wrong = " ".join(w for w in answer.split() if value not in w.lower())
            assert not env.check_answer(wrong), (suite, value)


def test_records_answer_needs_the_customer_name():
    env = make_env("records")
    _, history = oracle_episode(env, 100_000)
    answer = history[-1]["content"]
    first = env.target["name"].split()[0]
    assert first.lower() in env.answer_values()
    assert not env.check_answer(answer.replace(first, "Quito"))


def test_frontier_domain_judge_uses_the_values():
    from asymagent.evals.running.frontier import domain_conversations
    from asymagent.training.domains import domain_by_name
    from asymagent.training.long_episodes import long_episode

    messages, _ = long_episode(domain_by_name("parcels"), 100_000)
    expected = next(m["content"] for m in messages if m["role"] == "assistant" and not m.get("tool_calls"))
    assert "origin Quito" in expected  # the episode this test pins
    conv = domain_conversations("parcels", [100_000], None)[0]
    step = next(s for s in conv.steps if s.tool_choice == "auto")
    assert step.judge(None, expected) and step.judge([], expected.upper())
    assert not step.judge(None, expected.replace("Quito", "Cebu"))  # the digits alone do not decide
    assert not step.judge([{"function": {"name": "get_shipment", "arguments": "{}"}}], expected)


def test_regrade_probe_moves_only_final_answers():
    from asymagent.evals.probes.regrade import frontier_table, regrade_frontier
    from asymagent.evals.running.frontier import Record, domain_conversations

    conv = domain_conversations("parcels", [100_000], None)[0]
    last = len(conv.steps) - 1
    assert conv.steps[last].final and not conv.steps[0].final
    blank = {k: 0 for k in Record.__dataclass_fields__}
    blank.update(workload="domain:parcels", seed=100_000, token_ids=[], attacked=None, compression_ratio=1.0)
    call = '{"name": "list_shipments", "arguments": "{\\"page\\": 1}"}'
    records = [dict(blank, step=0, policy=p, correct=True, text=call) for p in ("full", "asym")]
    records += [dict(blank, step=last, policy="full", correct=True, text="The origin of 1Z085E82138 is Cebu."),
                dict(blank, step=last, policy="asym", correct=True, text="1Z085E82138 has origin DAKAR")]
    doc = {"settings": {"split": "test", "episodes": 1, "max_steps": None,
                        "policies": {"full": {"label": "full"}, "asym": {"label": "asym"}}}, "records": records}
    new, moves = regrade_frontier(doc)
    assert [(m["policy"], m["old"], m["new"], m["legacy_mismatch"]) for m in moves] == [("full", True, False, False)]
    assert [r["correct"] for r in new] == [True, True, False, True]
    table = frontier_table(doc, new)["domain:parcels"]
    assert table["asym"]["accuracy"] == [1.0, 1.0] and table["full"]["accuracy"] == [1.0, 0.5]
    assert table["asym"]["right_where_full_right"] == [1.0, 1.0]
