"""The agent frameworks, unmodified, against the real server on 127.0.0.1, on the Chat Completions and
Responses paths (evals/probes/framework_matrix.py's checks: the openai client, pydantic-ai's
OpenAIChatModel / OpenAIResponsesModel, the openai-agents SDK's default path (a model by name)
and its chat model, litellm, ChatOpenAI(use_responses_api=True/False) in a LangGraph agent,
instructor). The embedded default model (slow): the frameworks need a model that writes an
answer and stops (a random tiny model runs to max_tokens with no text, which pydantic-ai and
openai-agents rightly refuse). A framework that is not installed is skipped with its name."""

from __future__ import annotations

import pytest
from test_server import serving

from asymagent.evals.probes import framework_matrix as fm
from asymagent.integrations.server import create_app

CASES = [(name, path) for name, (_, checks) in fm.FRAMEWORKS.items() for path in checks]


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def url():
    from asymagent.engine import Engine

    app = create_app(Engine.from_default(), max_queue=8, request_timeout=300,
                     default_max_tokens=fm.MAX_TOKENS)
    with serving(app) as base:
        yield base


@pytest.mark.parametrize("framework, path", CASES)
def test_framework_path_works(url, framework, path):
    module = fm.FRAMEWORKS[framework][0]
    if not fm.installed(module):
        pytest.skip(f"{framework} is not installed (module {module!r}); pip install it to run")
    row = fm.run_check(framework, path, url, "asymagent")
    assert row["works"], row["detail"]
