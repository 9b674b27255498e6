"""Engine: the facade over the four decoding modes (full, compressed, spec, asym) and chat.

- full: the verifier alone on the full prompt (one cache).
- compressed: the verifier alone on the compressed prompt (one cache).
- spec: classic speculative decoding, drafter and verifier both on the full prompt (two caches);
  the gate's target is the verifier, so with acceptance exact/greedy it is lossless.
- asym: context-asymmetric speculation (DESIGN.md §3): drafter on the full view, verifier and
  base pass on the compressed view (three caches), delta-fusion and the JSD-aware gate.
Caches live in per-`cache_key` sessions (bounded LRU) and are reused up to the longest common
prefix with the next prompt (asymagent/cache.py). The round loop is asymagent/speculation.py.
`Engine.chat` delegates to asymagent/chat_session.py (messages -> views -> generate -> ChatResult).
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from asymagent.adaptive_k import AdaptiveK
from asymagent.attention import use_gqa_attention
from asymagent.cache import CacheStore, View
from asymagent.flops import FlopCounter
from asymagent.spec_config import MODES, SpecConfig
from asymagent.speculation import DraftHead, Speculator, advance_constraint
from asymagent.stats import StepStats
from asymagent.stopping import StopChecker, eos_ids

@dataclass
class GenerationResult:
    """What `Engine.generate` returns."""

    token_ids: list  # list[int], new tokens only (a final EOS included, cut at a stop string)
    text: str
    stats: StepStats
    finish_reason: str  # stop | length | tool_calls | cancelled


@dataclass
class ChatResult(GenerationResult):
    """What `Engine.chat` returns: `text` is the content without the tool-call JSON."""

    tool_calls: list = field(default_factory=list)  # OpenAI shape
    invalid_tool_calls: list = field(default_factory=list)  # LangChain shape


@dataclass
class _Tally:
    """Speculation accounting of one call (vLLM's definitions, see asymagent/stats.py)."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens emitted by speculative rounds (accepted + recovered/bonus)
    last_k: int = 0
    jsd_sum: float = 0.0
    lookup_rounds: int = 0
    reached: list = field(default_factory=list)  # [i]: rounds that reached draft position i
    accepted_at: list = field(default_factory=list)  # [i]: rounds that accepted position i

    def record(self, out) -> None:
        self.rounds += 1
        self.drafted += out.drafted
        self.accepted += out.accepted
        self.emitted += len(out.tokens)
        self.last_k = out.drafted
        self.lookup_rounds += int(out.lookup)
        self.jsd_sum += out.jsd
        for i in range(min(out.accepted + 1, out.drafted)):  # positions the gate looked at
            if i == len(self.reached):
                self.reached.append(0)
                self.accepted_at.append(0)
            self.reached[i] += 1
            self.accepted_at[i] += int(i < out.accepted)

    def fill(self, stats: StepStats, asym: bool) -> None:
        stats.rounds, stats.drafted, stats.accepted = self.rounds, self.drafted, self.accepted
        stats.lookup_rounds = self.lookup_rounds
        stats.k = self.last_k
        stats.acceptance_by_position = [a / r for a, r in zip(self.accepted_at, self.reached)]
        stats._reached_by_position = list(self.reached)  # RunStats pooling (not serialised)
        stats.mean_accepted_len = self.emitted / self.rounds if self.rounds else 0.0
        stats.mean_jsd = self.jsd_sum / self.rounds if asym and self.rounds else 0.0


def _vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


class Engine:
    """Local inference engine: verifier (+ drafter) with reusable KV caches and four modes."""

    def __init__(self, verifier, drafter=None, tokenizer=None, spec: SpecConfig | None = None,
                 compression=None, draft_vocab: torch.Tensor | None = None,
                 max_sessions: int = 4) -> None:
        self.verifier = verifier.eval()
        self.drafter = drafter.eval() if drafter is not None else None
        for model in (self.verifier, self.drafter):  # verify forwards read grouped KV in place
            if model is not None:
                use_gqa_attention(model)
        self.tokenizer = tokenizer
        self.spec = spec if spec is not None else SpecConfig()
        self.spec.validate()
        self.compression = compression
        self.vocab_size = _vocab_size(verifier)
        self.max_positions = int(getattr(verifier.config, "max_position_embeddings", 0) or 0)
        self.device = next(verifier.parameters()).device
        self.head = None
        if self.drafter is not None:
            if _vocab_size(self.drafter) != self.vocab_size:
                raise ValueError(
                    f"drafter/verifier vocabulary mismatch: the drafter's head has "
                    f"{_vocab_size(self.drafter)} rows, the verifier's {self.vocab_size}; "
                    "speculation needs one shared tokenizer and vocabulary")
            if draft_vocab is None:
                draft_vocab = getattr(self.drafter, "asymagent_draft_vocab", None)
            if draft_vocab is not None:
                draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.long).flatten()
                if draft_vocab.numel() == 0 or int(draft_vocab.min()) < 0 or \
                        int(draft_vocab.max()) >= self.vocab_size:
                    raise ValueError(f"draft_vocab must hold ids in [0, {self.vocab_size})")
            self.head = DraftHead(self.drafter, draft_vocab)
        self.eos_ids = eos_ids(verifier, tokenizer)
        self.flops = FlopCounter.from_config(verifier.config)
        roles = {"verifier_full": verifier, "verifier_compressed": verifier}
        if self.drafter is not None:
            roles.update(drafter_full=self.drafter, drafter_compressed=self.drafter)
        self.caches = CacheStore(roles, max_sessions=max_sessions)
        self._chat_format = None  # ChatFormat, built on the first chat (chat_session)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_pretrained(cls, verifier, drafter=None, spec: SpecConfig | None = None,
                        compression=None, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device | None = None, **kw) -> "Engine":
        """Load verifier (and drafter) with asymagent.models.load_model (id, dir or GGUF).

        A drafter given as a `.safetensors` file is an asymagent drafter (decoder layers + draft
        vocabulary, asymagent.drafter.save_drafter) and is attached to the verifier's embeddings.
        """
        from asymagent.models import load_model

        ver = load_model(verifier, dtype=dtype)
        dra = None
        if drafter is not None and str(drafter).endswith(".safetensors"):
            from asymagent.drafter import load_drafter

            dra = load_drafter(drafter, ver.model)
        elif drafter is not None:
            dra = load_model(drafter, dtype=dtype).model
        if device is not None:
            ver.model.to(device)
            if dra is not None:
                dra.to(device)
        return cls(verifier=ver.model, drafter=dra, tokenizer=ver.tokenizer, spec=spec,
                   compression=compression, **kw)

    @classmethod
    def from_default(cls, spec: SpecConfig | None = None, compression=None, **kw) -> "Engine":
        """The embedded pair: SmolLM2-135M-Instruct verifier + the project's trained drafter.

        `compression=None` means the default CompressionConfig (as everywhere in asymagent.views).
        """
        from asymagent.models import ModelNotFoundError, load_default_verifier

        loaded = load_default_verifier()
        try:
            from asymagent.drafter import load_default_drafter

            drafter = load_default_drafter(loaded.model, verifier_fingerprint=loaded.fingerprint)
        except (ImportError, FileNotFoundError) as exc:
            raise ModelNotFoundError(
                f"No default drafter is available ({exc}). Train one with "
                "`asymagent train-drafter` (it writes the drafter asset into the package), or "
                "pass your own: Engine.from_pretrained(verifier=..., drafter=...).") from exc
        return cls(verifier=loaded.model, drafter=drafter, tokenizer=loaded.tokenizer,
                   spec=spec, compression=compression, **kw)

    # ------------------------------------------------------------------ validation
    def _validate(self, prompt_ids, mode, max_new_tokens, temperature, top_p,
                  compressed_prompt_ids, stop) -> tuple[list, list, list]:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        if mode in ("spec", "asym") and self.drafter is None:
            raise ValueError(f"mode {mode!r} needs a drafter; this engine has none "
                             "(use mode 'full' or 'compressed', or pass drafter=)")
        if isinstance(prompt_ids, torch.Tensor):
            prompt_ids = prompt_ids.flatten().tolist()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: give at least one token")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        if not (0.0 < top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if compressed_prompt_ids is None:
            compressed = prompt
        else:
            if isinstance(compressed_prompt_ids, torch.Tensor):
                compressed_prompt_ids = compressed_prompt_ids.flatten().tolist()
            compressed = [int(t) for t in compressed_prompt_ids]
            if not compressed:
                raise ValueError("compressed_prompt_ids is empty")
        for name, ids in (("prompt_ids", prompt), ("compressed_prompt_ids", compressed)):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"{name} has ids outside the vocabulary [0, {self.vocab_size}): "
                                 f"{bad[:5]}")
            if self.max_positions and len(ids) >= self.max_positions:
                raise ValueError(
                    f"{name} has {len(ids)} tokens but the model's context limit "
                    f"(max_position_embeddings) is {self.max_positions}; leave room to generate")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop must be non-empty strings, got {stops!r}")
        if stops and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this engine has none")
        return prompt, compressed, stops

    # ------------------------------------------------------------------ generate
    def generate(self, prompt_ids, mode: str = "asym", max_new_tokens: int = 64,
                 temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0,
                 compressed_prompt_ids=None, stop=None, constraint=None, callback=None,
                 cache_key: str = "default") -> GenerationResult:
        """Generate up to `max_new_tokens` new tokens after `prompt_ids` (see module docstring)."""
        prompt, compressed, stops = self._validate(prompt_ids, mode, max_new_tokens,
                                                   float(temperature), float(top_p),
                                                   compressed_prompt_ids, stop)
        t_start = time.perf_counter()
        spec = self.spec
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(seed) if seed is not None else secrets.randbits(63))
        session = self.caches.session(cache_key)
        generated: list = []
        full_view = View(prompt, generated)
        ver_prompt = compressed if mode in ("compressed", "asym") else prompt
        # A mode's verifier always reads the same cache: in an agent loop step 0 often has
        # nothing to compress (compressed == full), and switching caches at step 1 would
        # re-prefill the whole compressed view instead of only the appended messages.
        ver_role = "verifier_compressed" if mode in ("compressed", "asym") else "verifier_full"
        ver_view = View(ver_prompt, generated)
        stats = StepStats(mode=mode, full_context_tokens=len(prompt),
                          verifier_context_tokens=len(ver_prompt),
                          compression_ratio=len(ver_prompt) / len(prompt))

        # Prefill: keep the longest common prefix, feed the rest except the last token (the
        # first round's forward feeds it and reads its logits).
        def prefill(role: str, view: View) -> tuple[int, float]:
            """(tokens to prefill incl. the re-fed last one, FLOPs of this prefill forward)."""
            cache = session.get(role)
            ids = view.ids()
            kept = cache.reuse_prefix(ids)
            cache.prefill(ids[kept:-1], desc=f"prefill {role}")
            return len(ids) - kept, self.flops.forward(len(ids) - 1 - kept, kept)

        stats.verifier_prefill_tokens, prefill_flops = prefill(ver_role, ver_view)
        dec = Speculator(verifier=session.get(ver_role), view_v=ver_view, flops=self.flops,
                         temperature=float(temperature), top_p=float(top_p), generator=generator,
                         constraint=constraint, verifier_flops=prefill_flops,
                         lookup_ngram=spec.lookup_ngram)
        asym = mode == "asym"
        if mode in ("spec", "asym"):
            stats.drafter_prefill_tokens = prefill("drafter_full", full_view)[0]
            dec.drafter, dec.view_d, dec.head = session.get("drafter_full"), full_view, self.head
            if asym and compressed != prompt:
                base_view = View(compressed, generated)
                stats.drafter_prefill_tokens += prefill("drafter_compressed", base_view)[0]
                dec.base, dec.view_b = session.get("drafter_compressed"), base_view
        t_prefill = time.perf_counter()
        stats.prefill_s = t_prefill - t_start

        checker = StopChecker(self.eos_ids, stops, self.tokenizer)
        adaptive = AdaptiveK(k=spec.k, k_min=spec.k_min, k_max=spec.k_max)
        speculating = mode in ("spec", "asym")
        jsd_window: deque = deque(maxlen=spec.escalate_window)
        tally = _Tally()
        finish = "length"
        ttft = None
        while len(generated) < max_new_tokens:
            remaining = max_new_tokens - len(generated)
            longest = max(len(full_view), len(ver_view))
            room = (self.max_positions - longest) if self.max_positions else remaining
            if room < 1:  # the context limit: no position left for another token
                break
            if constraint is not None and constraint.is_terminated():
                finish = "stop"  # a constraint that is already complete admits nothing more
                break
            # Jump-forward: tokens the constraint alone determines are emitted without a model
            # forward (the next forward feeds them as pending tokens), before the first round too.
            new = [] if constraint is None else \
                [int(t) for t in constraint.forced_tokens()[: min(remaining, room)]]
            jumped = bool(new)
            if not jumped:
                k = min(adaptive.k if spec.adaptive_k else spec.k, remaining - 1, room - 1)
                probe = spec.adaptive_k and speculating and adaptive.want_probe()
                if not speculating or k < 1 or probe or not adaptive.enabled:
                    out = dec.plain_step()
                    if probe:
                        adaptive.record_plain(out.verify_s)
                else:
                    if asym and len(generated) < spec.strict_prefix:
                        rule = "exact" if temperature > 0 else "greedy"
                    else:
                        rule = spec.acceptance if asym else spec.spec_acceptance
                    if rule == "greedy" and temperature > 0:
                        rule = "exact"  # "the target decides", sampled: rejection sampling
                    out = dec.spec_round(k, asym=asym, acceptance=rule, beta=spec.beta,
                                         gamma=spec.gamma, fuse_bonus=spec.fuse_bonus,
                                         lookup_k=min(spec.lookup_k, remaining - 1, room - 1))
                    if out.drafted:  # 0: the constraint left nothing to draft, a plain step ran
                        tally.record(out)
                        if not out.lookup:  # adaptive K tunes the drafter's K only
                            adaptive.record_round(out.drafted, out.accepted, out.draft_s, out.verify_s)
                        if asym:
                            jsd_window.append(out.jsd)
                new = out.tokens
            start = len(generated)
            generated.extend(new)
            # Cut first (EOS kept, stop string cut), then advance the constraint through the kept
            # tokens only, up to its termination: it sees exactly the tokens that are emitted.
            keep = checker.first_stop(generated, start)
            if keep is not None:
                del generated[keep:]
                finish = "stop"
            if constraint is not None:
                kept, forced = advance_constraint(constraint, generated[start:], jumped)
                del generated[start + kept:]
                stats.forced_tokens += forced
            if ttft is None and generated:
                ttft = time.perf_counter() - t_start
            if callback is not None and callback(generated[start:]) is False:
                finish = "cancelled"
                break
            if finish == "stop" or (constraint is not None and constraint.is_terminated()):
                finish = "stop"
                break
            if (asym and spec.escalate_jsd is not None and not stats.escalated
                    and len(jsd_window) == spec.escalate_window
                    and sum(jsd_window) / len(jsd_window) > spec.escalate_jsd):
                stats.escalated, speculating = True, False
                tokens, flops = prefill("verifier_full", full_view)
                stats.verifier_prefill_tokens += tokens
                dec.verifier_flops += flops
                dec.escalate(session.get("verifier_full"), full_view)

        now = time.perf_counter()
        stats.wall_s = now - t_start
        stats.ttft_s = ttft if ttft is not None else stats.wall_s
        stats.decode_s = now - t_prefill
        stats.new_tokens = len(generated)
        tally.fill(stats, asym)
        if spec.adaptive_k and not adaptive.enabled:
            stats.k = 0  # speculation switched off for this request
        stats.verifier_flops = dec.verifier_flops
        stats.finish_reason = finish
        return GenerationResult(token_ids=list(generated), text=checker.text(generated),
                                stats=stats, finish_reason=finish)

    # ------------------------------------------------------------------ chat
    def _logprob_fn(self, cache_key: str, counter: list):
        """The drafter's log-prob function of one conversation (asymagent.chat_session)."""
        from asymagent.chat_session import drafter_logprob_fn

        return drafter_logprob_fn(self, cache_key, counter)

    def chat(self, messages: list, tools: list | None = None, mode: str = "asym",
             max_new_tokens: int = 256, temperature: float = 0.0, seed: int | None = None,
             top_p: float = 1.0, stop=None, tool_choice="auto", callback=None,
             cache_key: str = "default") -> ChatResult:
        """OpenAI-style chat: render both views, generate, parse text and tool calls.

        The chat layer lives in asymagent/chat_session.py (`run_chat`): message validation,
        tool_choice -> ToolCallConstraint, the conversation's ContextViews (per `cache_key`), the
        drafter's log-probs for surprisal compression, and output parsing into a ChatResult.
        """
        from asymagent.chat_session import run_chat  # it imports this module (ChatResult)

        return run_chat(self, messages, tools=tools, mode=mode, max_new_tokens=max_new_tokens,
                        temperature=temperature, seed=seed, top_p=top_p, stop=stop,
                        tool_choice=tool_choice, callback=callback, cache_key=cache_key)
