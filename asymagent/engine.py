"""Engine: the facade over the four decoding modes (full, compressed, spec, asym) and chat.

- full: the verifier alone on the full prompt (one cache).
- compressed: the verifier alone on the compressed prompt (one cache).
- spec: classic speculative decoding, drafter and verifier both on the full prompt (two caches);
  the gate's target is the verifier, so with acceptance exact/greedy it is lossless.
- asym: context-asymmetric speculation (docs/architecture.md, "The algorithm"): drafter on the
  full view, verifier and base pass on the compressed view (three caches), delta-fusion and the
  JSD-aware gate.
Thread safety: `generate` and `chat` hold the engine's FairLock (asymagent/fair_lock.py), so
requests from many threads (or `asyncio.to_thread`) run one at a time in arrival order and each
sees its conversation's caches and views as its predecessor left them.
Caches live in per-`cache_key` sessions (bounded LRU) and are reused up to the longest common
prefix with the next prompt (asymagent/kv/cache.py). `generate` prefills the caches its mode
reads and runs the decode loop (asymagent/decoding/loop.py) over one speculative round at a time
(asymagent/decoding/round.py). `chat` is asymagent/chat/session.py (messages -> views ->
generate -> ChatResult).
"""

from __future__ import annotations

import secrets
import threading
import time

import torch

from asymagent.chat.chat_format import ChatFormat
from asymagent.chat.session import run_chat
from asymagent.decoding.copy_delta import CopyDelta
from asymagent.decoding.flops import FlopCounter
from asymagent.decoding.logit_processors import LogitProcessors
from asymagent.decoding.logprobs import LogprobRecorder, score_tokens
from asymagent.decoding.lookup_drafter import LookupDrafter
from asymagent.decoding.loop import decode_loop
from asymagent.decoding.model_drafter import DraftHead, ModelDrafter
from asymagent.decoding.noise import KeyedNoise
from asymagent.decoding.round import Decoder
from asymagent.decoding.stopping import StopChecker, eos_ids
from asymagent.decoding.suffix_drafter import SuffixDrafter
from asymagent.decoding.suffix_store import SuffixStore
from asymagent.fair_lock import FairLock
from asymagent.kv.attention import use_gqa_attention
from asymagent.kv.cache import CacheStore, View, ViewCache
from asymagent.results import ChatResult, GenerationResult  # noqa: F401  (old import path)
from asymagent.spec_config import SpecConfig, mode_of
from asymagent.stats import StepStats


def _vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


class Engine:
    """Local inference engine: verifier (+ drafter) with reusable KV caches and four modes."""

    def __init__(self, verifier, drafter=None, tokenizer=None, spec: SpecConfig | None = None,
                 compression=None, draft_vocab: torch.Tensor | None = None,
                 max_sessions: int = 4, suffix_store: SuffixStore | None = None,
                 verifier_fingerprint: str | None = None, static_kv: bool = False,
                 cuda_graphs: bool | None = None) -> None:
        """`cuda_graphs`: decode with static KV caches and CUDA-graph captured forwards
        (asymagent/kv/static_cache.py); None reads ASYMAGENT_CUDA_GRAPHS on CUDA, off on CPU.
        `static_kv`: the static caches without graphs (any device)."""
        self.verifier = verifier.eval()
        self.drafter = drafter.eval() if drafter is not None else None
        for model in (self.verifier, self.drafter):  # verify forwards read grouped KV in place
            if model is not None:
                use_gqa_attention(model)
        self.tokenizer = tokenizer
        # sha256 of the verifier's weights file when loaded from one (captured traces carry it)
        self.verifier_fingerprint = verifier_fingerprint
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
        from asymagent.kv.static_cache import static_roles  # transformers' cache classes

        self.static_roles = static_roles(roles, self.device, static_kv=static_kv,
                                         cuda_graphs=cuda_graphs)
        self.caches = CacheStore(roles, max_sessions=max_sessions, static=self.static_roles)
        self._chat_format: ChatFormat | None = None  # built on first use (`chat_format`)
        self._format_lock = threading.Lock()  # builds chat_format once (not the request lock)
        # one request at a time, first come first served: sessions, caches and views are shared
        self.lock = FairLock()
        # earlier responses for suffix drafting (SuffixStore(path=...) keeps them across runs)
        self.suffix_store = suffix_store if suffix_store is not None else SuffixStore()

    @property
    def chat_format(self) -> ChatFormat:
        """How messages and tools render to tokens and how output parses (built once, lazily)."""
        if self._chat_format is None:
            with self._format_lock:
                if self._chat_format is None:
                    self._chat_format = ChatFormat(self.tokenizer)
        return self._chat_format

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_pretrained(cls, verifier, drafter=None, spec: SpecConfig | None = None,
                        compression=None, *, dtype: torch.dtype = torch.float32,
                        device: str | torch.device | None = None, config=None, **kw) -> "Engine":
        """Load verifier (and drafter) with asymagent.modeling.loading.load_model (id, dir or GGUF).

        `config`: a config file (asymagent/config_file.py, e.g. what `asymagent tune` writes)
        supplying `spec` and `compression` where they are not given.

        A drafter given as a `.safetensors` file is an asymagent drafter (decoder layers + draft
        vocabulary, asymagent.modeling.drafter.save_drafter) and is attached to the verifier's embeddings.
        """
        from asymagent.config_file import engine_settings
        from asymagent.modeling.loading import load_model

        spec, compression = engine_settings(config, spec, compression)
        ver = load_model(verifier, dtype=dtype)
        dra = None
        if drafter is not None and str(drafter).endswith(".safetensors"):
            from asymagent.modeling.drafter import load_drafter

            dra = load_drafter(drafter, ver.model)
        elif drafter is not None:
            dra = load_model(drafter, dtype=dtype).model
        if device is not None:
            ver.model.to(device)
            if dra is not None:
                dra.to(device)
        kw.setdefault("verifier_fingerprint", ver.fingerprint)
        return cls(verifier=ver.model, drafter=dra, tokenizer=ver.tokenizer, spec=spec,
                   compression=compression, **kw)

    @classmethod
    def from_default(cls, spec: SpecConfig | None = None, compression=None, *, config=None,
                     dtype: torch.dtype = torch.float32, device: str | torch.device | None = None,
                     **kw) -> "Engine":
        """The embedded pair: SmolLM2-135M-Instruct verifier + the project's trained drafter.

        `compression=None` means the default CompressionConfig (as everywhere in asymagent.context.views).
        `dtype` and `device` place both models (the drafter follows the verifier's dtype).
        `config`: a config file (asymagent/config_file.py, e.g. what `asymagent tune` writes)
        supplying `spec` and `compression` where they are not given.
        """
        from asymagent.config_file import engine_settings
        from asymagent.modeling.loading import ModelNotFoundError, load_default_verifier

        spec, compression = engine_settings(config, spec, compression)

        loaded = load_default_verifier(dtype=dtype)
        if device is not None:
            loaded.model.to(device)
        try:
            from asymagent.modeling.drafter import load_default_drafter

            drafter = load_default_drafter(loaded.model, verifier_fingerprint=loaded.fingerprint)
        except (ImportError, FileNotFoundError) as exc:
            raise ModelNotFoundError(
                f"No default drafter is available ({exc}). Train one with "
                "`asymagent train-drafter` (it writes the drafter asset into the package), or "
                "pass your own: Engine.from_pretrained(verifier=..., drafter=...).") from exc
        kw.setdefault("verifier_fingerprint", loaded.fingerprint)
        return cls(verifier=loaded.model, drafter=drafter, tokenizer=loaded.tokenizer,
                   spec=spec, compression=compression, **kw)

    # ------------------------------------------------------------------ validation
    def _validate(self, prompt_ids, mode, max_new_tokens, temperature, top_p,
                  compressed_prompt_ids, stop) -> tuple[list, list, list]:
        if mode_of(mode).speculative and self.drafter is None:
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
                 cache_key: str = "default", *, top_k: int = 0, min_p: float = 0.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 logit_bias: dict | None = None,
                 logprobs: int | LogprobRecorder | None = None) -> GenerationResult:
        """Generate up to `max_new_tokens` new tokens after `prompt_ids` (see module docstring).

        top_k, min_p, frequency_penalty, presence_penalty, logit_bias ({token id: bias}) act on
        the verifier's rows as OpenAI/vLLM define them (asymagent/decoding/logit_processors.py).
        `logprobs`: None (off), or how many top alternatives to keep per token (0..20), or a
        LogprobRecorder to read while streaming; the result's `logprobs` then holds one
        TokenLogprob per new token, from the verifier's own rows (asymagent/decoding/logprobs.py).

        Thread-safe: requests to one engine run one at a time, in arrival order (`self.lock`).
        `callback` runs while the request holds the lock; it must not wait for another request.
        """
        with self.lock:
            return self._generate(prompt_ids, mode, max_new_tokens, temperature, seed, top_p,
                                  compressed_prompt_ids, stop, constraint, callback, cache_key,
                                  top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
                                  presence_penalty=presence_penalty, logit_bias=logit_bias,
                                  logprobs=logprobs)

    def _generate(self, prompt_ids, mode, max_new_tokens, temperature, seed, top_p,
                  compressed_prompt_ids, stop, constraint, callback, cache_key, *, top_k, min_p,
                  frequency_penalty, presence_penalty, logit_bias, logprobs) -> GenerationResult:
        prompt, compressed, stops = self._validate(prompt_ids, mode, max_new_tokens,
                                                   float(temperature), float(top_p),
                                                   compressed_prompt_ids, stop)
        processors = LogitProcessors(
            frequency_penalty=float(frequency_penalty), presence_penalty=float(presence_penalty),
            logit_bias={int(t): float(b) for t, b in (logit_bias or {}).items()},
            top_k=top_k, min_p=float(min_p)).validate(self.vocab_size)
        recorder = logprobs if isinstance(logprobs, LogprobRecorder) or logprobs is None \
            else LogprobRecorder(logprobs)
        t_start = time.perf_counter()
        m = mode_of(mode)
        # every random number is keyed by (seed, output position, purpose), never by draw order
        noise = KeyedNoise(int(seed) if seed is not None else secrets.randbits(63),
                           self.vocab_size, self.device)
        session = self.caches.session(cache_key)
        generated: list = []  # the new tokens, shared by every view of the request
        full_view = View(prompt, generated)
        ver_prompt = compressed if m.compressed else prompt
        # A mode's verifier always reads the same cache: in an agent loop step 0 often has
        # nothing to compress (compressed == full), and switching caches at step 1 would
        # re-prefill the whole compressed view instead of only the appended messages.
        ver_role = "verifier_compressed" if m.compressed else "verifier_full"
        ver_view = View(ver_prompt, generated)
        stats = StepStats(mode=mode, full_context_tokens=len(prompt),
                          verifier_context_tokens=len(ver_prompt),
                          compression_ratio=len(ver_prompt) / len(prompt))

        # Prefill: keep the longest common prefix, feed the rest except the last token (the
        # first round's forward feeds it and reads its logits).
        def prefill(role: str, view: View) -> tuple[ViewCache, int, float]:
            """(the role's cache on `view`, tokens to prefill incl. the re-fed last one, FLOPs)."""
            cache = session.get(role)
            ids = view.ids()
            # a static cache is sized once for the request: the view, the new tokens, the drafts
            cache.reserve(len(ids) + max_new_tokens + 2
                          + max(self.spec.k, self.spec.k_max, self.spec.lookup_k))
            kept = cache.reuse_prefix(ids)
            cache.prefill(ids[kept:-1], desc=f"prefill {role}")
            return ViewCache(cache, view), len(ids) - kept, self.flops.forward(len(ids) - 1 - kept, kept)

        verifier, stats.verifier_prefill_tokens, prefill_flops = prefill(ver_role, ver_view)
        stats.cached_tokens = len(ver_prompt) - stats.verifier_prefill_tokens
        drafter = base = None
        drafters: list = []
        sampler = dict(temperature=float(temperature), noise=noise, constraint=constraint)
        copy = None
        if m.speculative:
            sp = self.spec
            drafter, stats.drafter_prefill_tokens, _ = prefill("drafter_full", full_view)
            # the drafter on the compressed view serves delta-fusion (beta), cda's base row and
            # escalation's JSD; with none of them its prefill and per-round base pass are skipped
            needs_base = sp.beta > 0 or sp.acceptance == "cda" or sp.escalate_jsd is not None
            if m.fused and compressed != prompt and needs_base:
                base, tokens, _ = prefill("drafter_compressed", View(compressed, generated))
                stats.drafter_prefill_tokens += tokens
            if m.fused and compressed != prompt and sp.copy_weight > 0:
                copy = CopyDelta(full_view, ver_view, sp.copy_weight, min_len=sp.copy_min_len)
            if sp.lookup_ngram and sp.suffix:
                # earlier responses only where drafts cannot change the output: with cda or
                # exact at T > 0 the rounds' layout is part of the rule, and a store that other
                # requests filled would make the output depend on them (same seed, same output)
                store = self.suffix_store if sp.position_invariant(m, float(temperature)) else None
                drafters.append(SuffixDrafter(full_view, store, constraint,
                                              factor=sp.suffix_factor, min_prob=sp.suffix_min_prob,
                                              max_depth=sp.suffix_max_depth,
                                              min_match=min(2, sp.lookup_ngram)))
            elif sp.lookup_ngram:
                drafters.append(LookupDrafter(full_view, sp.lookup_ngram, constraint))
            drafters.append(ModelDrafter(drafter, self.head, bonus_row=m.fused, **sampler))
        decoder = Decoder(verifier, self.flops, top_p=float(top_p), drafters=drafters,
                          drafter=drafter, base=base, head=self.head, fused=m.fused,
                          verifier_flops=prefill_flops, copy=copy, processors=processors,
                          logprobs=recorder, **sampler)
        t_prefill = time.perf_counter()
        stats.prefill_s = t_prefill - t_start

        def escalate() -> None:  # finish on the full context (SpecConfig.escalate_jsd)
            full, tokens, flops = prefill("verifier_full", full_view)
            stats.verifier_prefill_tokens += tokens
            decoder.verifier_flops += flops
            decoder.escalate(full)

        checker = StopChecker(self.eos_ids, stops, self.tokenizer)
        loop = decode_loop(decoder, generated, mode=m, spec=self.spec, max_new_tokens=max_new_tokens,
                           temperature=float(temperature), views=(full_view, ver_view),
                           max_positions=self.max_positions, checker=checker, stats=stats,
                           t_start=t_start, constraint=constraint, callback=callback,
                           escalate=escalate)
        if recorder is not None:
            recorder.truncate(len(generated))  # tokens cut by a stop string or the constraint
            decoder.score_pending()  # jump-forward tokens at the end: one more forward
        now = time.perf_counter()
        stats.wall_s = now - t_start
        stats.ttft_s = loop.ttft_s if loop.ttft_s is not None else stats.wall_s
        stats.decode_s = now - t_prefill
        stats.new_tokens = len(generated)
        loop.tally.fill(stats, m.fused)
        if loop.speculation_off:
            stats.k = 0  # the drafter model was switched off for this request
        stats.verifier_flops = decoder.verifier_flops
        stats.finish_reason = loop.finish
        self.suffix_store.add(generated)  # later requests may copy from this response
        return GenerationResult(token_ids=list(generated), text=checker.text(generated),
                                stats=stats, finish_reason=loop.finish,
                                logprobs=None if recorder is None else list(recorder.entries))

    def score(self, prompt_ids, top_logprobs: int = 0) -> list:
        """The verifier's log-probability of every prompt token given the ones before it
        (TokenLogprob per token, the first with logprob None): prompt scoring for evals
        (`/v1/completions` with `echo`). Uses no cache session; holds `self.lock` like `generate`."""
        prompt, _, _ = self._validate(prompt_ids, "full", 1, 0.0, 1.0, None, None)
        with self.lock:
            return score_tokens(self.verifier, prompt, top_logprobs)

    # ------------------------------------------------------------------ chat
    def chat(self, messages: list, tools: list | None = None, mode: str = "asym",
             max_new_tokens: int = 256, temperature: float = 0.0, seed: int | None = None,
             top_p: float = 1.0, stop=None, tool_choice="auto", callback=None,
             cache_key: str = "default", *, response_format: dict | None = None,
             top_k: int = 0, min_p: float = 0.0, frequency_penalty: float = 0.0,
             presence_penalty: float = 0.0, logit_bias: dict | None = None,
             logprobs: int | LogprobRecorder | None = None,
             parallel_tool_calls: bool | None = None) -> ChatResult:
        """OpenAI-style chat: render both views, generate, parse text and tool calls.

        The chat layer lives in asymagent/chat/session.py (`run_chat`): message validation,
        tool_choice -> ToolCallConstraint, response_format (OpenAI's json_object / json_schema)
        -> ResponseFormatConstraint, the conversation's ContextViews (per `cache_key`), the
        drafter's log-probs for surprisal compression, and output parsing into a ChatResult.
        The sampling keywords are `generate`'s. `parallel_tool_calls` (OpenAI's field): True lets
        a constrained turn hold 1..8 calls, False keeps at most one call (the first); None (the
        default) constrains to one call and keeps every call an unconstrained turn wrote.
        Thread-safe like `generate`: the whole call (views, caches, decoding) holds `self.lock`.
        """
        sampling = dict(top_k=top_k, min_p=min_p, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias,
                        logprobs=logprobs)
        with self.lock:
            return run_chat(self, messages, tools=tools, mode=mode, max_new_tokens=max_new_tokens,
                            temperature=temperature, seed=seed, top_p=top_p, stop=stop,
                            tool_choice=tool_choice, callback=callback, cache_key=cache_key,
                            response_format=response_format, sampling=sampling,
                            parallel_tool_calls=parallel_tool_calls)
