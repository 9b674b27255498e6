"""The repetition penalty (vLLM's, asymagent/decoding/logit_processors.py) against its one-token-at-a-time
definition: every row of a speculative round sees prompt + generated + the drafts before it."""

from __future__ import annotations

import pytest
import torch

from asymagent.decoding.logit_processors import LogitProcessors, repetition_penalise


def reference(row: torch.Tensor, penalty: float, prefix: list) -> torch.Tensor:
    out = row.clone()
    for t in set(prefix):
        out[t] = out[t] / penalty if out[t] > 0 else out[t] * penalty
    return out


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
def test_rows_match_the_definition(penalty):
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(4, 50, generator=g)  # [K+1, V]
    prompt, generated, drafts = (3, 7, 7, 11), [20, 3], [30, 41, 20]
    out = repetition_penalise(rows, penalty, prompt, generated, drafts)
    for i in range(4):
        prefix = [*prompt, *generated, *drafts[:i]]
        assert torch.allclose(out[i], reference(rows[i], penalty, prefix))
    processors = LogitProcessors(repetition_penalty=penalty, prompt_ids=prompt)
    assert processors.penalises
    assert torch.allclose(processors.penalise(rows, generated, drafts), out)


def test_one_is_off_and_nonpositive_is_refused():
    rows = torch.randn(2, 10)
    assert not LogitProcessors(repetition_penalty=1.0, prompt_ids=(1, 2)).penalises
    with pytest.raises(ValueError, match="repetition_penalty"):
        repetition_penalise(rows, 0.0, (1,), [], [])
