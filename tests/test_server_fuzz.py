"""Property-based fuzzing of `asymagent serve` from its own OpenAPI schema (schemathesis + hypothesis).

The schema FastAPI publishes at /openapi.json drives schemathesis: for every operation it draws
requests that fit the schema (positive) and requests that break it (negative: wrong types,
missing fields, out-of-range values). The published schema is looser than the validators
(message role rules, for one), so half of the chat requests get a valid `messages` list and
the served model name swapped in, which lets the other fuzzed fields (max_tokens, temperature,
top_p, seed, stop, tools, tool_choice, stream, mode) reach the engine. The server must answer
every case below 500 and still serve afterwards. The number of cases is printed
(`RELIABILITY {...}`, `pytest -s`).
"""

from __future__ import annotations

import os
from collections import Counter

import httpx
import pytest

from asymagent.integrations.server import create_app
from server_probe import report
from test_server import USER, serving, tiny_engine

schemathesis = pytest.importorskip("schemathesis")

EXAMPLES = int(os.environ.get("ASYMAGENT_FUZZ_EXAMPLES", "150"))  # per operation and mode
VALID_MESSAGES = [USER, [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Name a colour."}]]


def test_fuzz_the_http_api_from_its_openapi_schema(smollm_tokenizer):
    from hypothesis import HealthCheck, given, settings, strategies as st
    from hypothesis.errors import Unsatisfiable

    # 256 positions bound any generation a fuzzed max_tokens can ask for; 5 s bounds a case.
    app = create_app(tiny_engine(smollm_tokenizer, max_positions=256), max_queue=4,
                     request_timeout=5, default_max_tokens=8, max_body_bytes=2**20)
    statuses: Counter = Counter()
    failures: list = []
    with serving(app) as url:
        schema = schemathesis.openapi.from_dict(httpx.get(url + "/openapi.json").json())
        operations = [result.ok() for result in schema.get_all_operations()]
        assert "POST /v1/chat/completions" in [op.label for op in operations]
        for op in operations:
            for mode in schemathesis.GenerationMode:
                @settings(max_examples=EXAMPLES, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck), derandomize=True)
                @given(case=op.as_strategy(mode), repair=st.booleans(),
                       messages=st.sampled_from(VALID_MESSAGES))
                def run(case, repair, messages):
                    if repair and isinstance(case.body, dict):
                        case.body["model"] = "asymagent"
                        if mode is schemathesis.GenerationMode.POSITIVE:
                            case.body["messages"] = messages
                    response = case.call(base_url=url, timeout=60)
                    statuses[(op.label, mode.value, response.status_code)] += 1
                    if response.status_code >= 500:
                        failures.append((case.body, response.status_code, response.text[:300]))

                try:
                    run()
                except Unsatisfiable:  # nothing to break in an operation without inputs
                    pass
        alive = httpx.get(url + "/health").status_code
        served = httpx.post(url + "/v1/chat/completions", timeout=60, json={
            "model": "asymagent", "messages": USER, "max_tokens": 2}).status_code
    assert not failures, failures[:3]
    assert alive == 200 and served == 200
    chat = {k[1:]: v for k, v in statuses.items() if k[0] == "POST /v1/chat/completions"}
    assert sum(v for (m, s), v in chat.items() if s == 200) > 0  # some cases reached the engine
    report("fuzz", {"cases": sum(statuses.values()), "examples_per_operation_mode": EXAMPLES,
                    "chat_cases_by_mode_status": {f"{m} {s}": v for (m, s), v in
                                                  sorted(chat.items())},
                    "status_5xx": 0})
