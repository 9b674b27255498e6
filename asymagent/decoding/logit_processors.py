"""Logit processors of a request: frequency/presence/repetition penalties, logit bias, top-k, min-p.

OpenAI's definitions, applied to the verifier's rows (the target the gate accepts against):
  logits[j] += logit_bias[j] - frequency_penalty * count[j] - presence_penalty * (count[j] > 0)
with count[j] how often token j occurs in the tokens generated so far (the prompt does not
count). Under speculation row i of a round (i = 0..K) also counts the drafts d_1..d_i before
it, so each row sees exactly the prefix it would see decoding one token at a time. top-k and
min-p truncate softmax(logits / T) like top-p (only at temperature > 0; greedy picks the argmax,
which both keep). The repetition penalty is vLLM's / HF's (CTRL's): a token that occurs in the
prompt or in the tokens generated so far has its logit divided by the penalty when positive and
multiplied by it when negative (penalty > 1 discourages repeats, < 1 encourages them, 1 is off);
`prompt_ids` are the prompt the verifier reads (the compressed view in modes compressed and
asym), and drafts count as for the other penalties. The drafter's proposals are left
unpenalised: a draft the penalised target does not want is rejected by the gate, so the output
follows the penalised target either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

NEG_INF = float("-inf")


@dataclass
class LogitProcessors:
    frequency_penalty: float = 0.0  # OpenAI range -2..2
    repetition_penalty: float = 1.0  # vLLM's; > 0, 1: off
    prompt_ids: tuple = ()  # the request's prompt (the repetition penalty counts its tokens)
    presence_penalty: float = 0.0  # OpenAI range -2..2
    logit_bias: dict = field(default_factory=dict)  # {token_id: bias}, OpenAI range -100..100
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off; keep tokens with p >= min_p * p_max

    @classmethod
    def of(cls, sampling, prompt_ids=()) -> "LogitProcessors":
        """The processors a request's SamplingParams (asymagent/request.py, where each field is
        checked) ask for; `prompt_ids` the prompt the rows continue (the repetition penalty's)."""
        repetition = sampling.repetition_penalty
        return cls(frequency_penalty=sampling.frequency_penalty,
                   presence_penalty=sampling.presence_penalty,
                   logit_bias=dict(sampling.logit_bias or {}), top_k=sampling.top_k,
                   min_p=sampling.min_p, repetition_penalty=repetition,
                   prompt_ids=tuple(prompt_ids) if repetition != 1.0 else ())

    @property
    def penalises(self) -> bool:
        return bool(self.frequency_penalty or self.presence_penalty or self.logit_bias
                    or self.repetition_penalty != 1.0)

    @property
    def truncates(self) -> bool:
        return bool(self.top_k or self.min_p)

    def penalise(self, rows: torch.Tensor, generated: list, drafts: list) -> torch.Tensor:
        """rows [R, V]: row i continues generated + drafts[:i]. Returns the adjusted rows."""
        if not self.penalises:
            return rows
        r, v = rows.shape
        out = rows.clone()
        if self.logit_bias:
            ids = torch.tensor(list(self.logit_bias), device=rows.device)
            out[:, ids] += torch.tensor(list(self.logit_bias.values()), device=rows.device,
                                        dtype=out.dtype)
        if self.frequency_penalty or self.presence_penalty:
            base = torch.bincount(torch.tensor(generated, dtype=torch.long), minlength=v)[:v]  # [V]
            counts = base.to(rows.device, out.dtype).expand(r, v).clone()  # [R, V]
            for i, d in enumerate(drafts[: r - 1]):  # draft d_{i+1} is in the prefix of rows > i
                counts[i + 1:, int(d)] += 1
            out -= self.frequency_penalty * counts + self.presence_penalty * (counts > 0).to(out.dtype)
        if self.repetition_penalty != 1.0:
            out = repetition_penalise(out, self.repetition_penalty, self.prompt_ids, generated,
                                      drafts)
        return out

    def truncate(self, logits: torch.Tensor, temperature: float) -> torch.Tensor:
        """[..., V] with tokens outside top-k / under min-p of softmax(logits / T) at -inf."""
        if not self.truncates or temperature <= 0.0:
            return logits
        if self.top_k and self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]  # [..., 1]
            logits = logits.masked_fill(logits < kth, NEG_INF)
        if self.min_p:
            probs = torch.softmax(logits / temperature, dim=-1)  # [..., V]
            logits = logits.masked_fill(probs < self.min_p * probs.amax(-1, keepdim=True), NEG_INF)
        return logits


def repetition_penalise(rows: torch.Tensor, penalty: float, prompt_ids, generated: list,
                        drafts: list) -> torch.Tensor:
    """rows [R, V], row i continuing prompt + generated + drafts[:i]: the logit of every token
    seen in that prefix divided by `penalty` where positive, multiplied where not (vLLM)."""
    if not penalty > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {penalty!r}")
    r, v = rows.shape
    seen_ids = torch.tensor([*prompt_ids, *generated], dtype=torch.long, device=rows.device)
    seen = torch.zeros(v, dtype=torch.bool, device=rows.device)  # [V]
    seen[seen_ids[(seen_ids >= 0) & (seen_ids < v)]] = True
    seen = seen.expand(r, v).clone()  # [R, V]
    for i, d in enumerate(drafts[: r - 1]):  # draft d_{i+1} is in the prefix of rows > i
        seen[i + 1:, int(d)] = True
    penalised = torch.where(rows > 0, rows / penalty, rows * penalty)
    return torch.where(seen, penalised, rows)
