"""The held-out suite "dispatch": each booking needs a playbook row with no digits and no word of the request."""

import json

import pytest

from asymagent.evals.suites.answer_values import STOPWORDS, words
from asymagent.evals.suites.environments import (HELD_OUT_SUITES, TEST_SEEDS, check_held_out, make_env,
                                                 oracle_episode, parse_call)


def _content(text: str) -> set:
    return {w for w in words(text) if w not in STOPWORDS and any(c.isalpha() for c in w)}


@pytest.mark.parametrize("seed", TEST_SEEDS[:3])
def test_oracle_solves_it_and_the_needed_fact_is_indirect(seed):
    env = make_env("dispatch")
    task, history = oracle_episode(env, seed)
    assert env.check_success(history[-1]["content"])
    assert not env.check_success("Dispatch done: all orders booked.")
    request = _content(task.system_prompt) | _content(task.user_prompt) | _content(json.dumps(task.tools))
    bookings = 0
    for i, m in enumerate(history):
        calls = m.get("tool_calls") or []
        if not calls or parse_call(calls[0])["name"] != "book_shipment":
            continue
        args = parse_call(calls[0])["arguments"]
        order_output = history[i - 1]["content"]  # the get_order output the step reads
        city = next(o["city"] for o in env.orders if o["id"] == args["order_id"])
        area = env.area_of[city]
        row = env.partner_row(area)
        assert row in history[3]["content"]  # the playbook holds it
        assert args["partner"] == env.partner_of[area] and args["partner"] in row
        assert not any(c.isdigit() for c in row)  # no digits
        fact = _content(row)
        assert fact and not fact & request  # no word shared with the request (prompts, tool schemas)
        assert not fact & _content(order_output)  # the order names it only through its city
        assert city in order_output and area not in order_output
        bookings += 1
    assert bookings == len(env.orders) >= 6


def test_held_out_test_seeds_only():
    assert "dispatch" in HELD_OUT_SUITES
    check_held_out("dispatch", list(TEST_SEEDS[:2]))
    check_held_out("records", [0, 1])  # other suites keep their dev split
    with pytest.raises(ValueError, match="held out"):
        check_held_out("dispatch", [0])


def test_frontier_workload_builds_on_test_and_refuses_dev():
    from asymagent.evals.running.frontier import conversations

    convs = conversations("dispatch", "test", 1, 5, 12)
    assert len(convs) == 1 and len(convs[0].steps) == 5 and convs[0].steps[-1].final
    with pytest.raises(ValueError, match="held out"):
        conversations("dispatch", "dev", 1, 5, 12)


def test_eval_cli_refuses_dev_split(no_model_loads, run_cli):
    code, err = run_cli(["eval", "dispatch", "--split", "dev"])
    assert code == 2 and "held out" in err and "Traceback" not in err
