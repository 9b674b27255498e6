"""Chat layer around the engine's decoding: messages -> both views (+ constraint); output -> text + tool calls.

`Engine.chat` (docs/architecture.md §4) is `prepare_chat` -> the engine's plan/prefill/loop ->
`chat_result`. `prepare_chat` validates the OpenAI-style messages, turns the request's
`tool_choice` into a `ToolCallConstraint` (or its `response_format` into a
`ResponseFormatConstraint`), builds the full and compressed views with the conversation's
append-stable `ContextViews` (one per `cache_key`, asymagent/chat/conversation.py) and offers
the drafter's log-probs to surprisal compression (computed while prefilling the drafter's
full-view cache, so the decoding finds it warm). `chat_result` parses the output into a
`ChatResult`. The engine keeps the caches and the decoding; this module keeps the conversation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from asymagent.chat.auto_tool_constraint import AutoToolConstraint
from asymagent.chat.response_format import ResponseFormatConstraint, format_schema, split_output
from asymagent.context.recall import recall_loop
from asymagent.context.views import ContextViews
from asymagent.kv.cache import common_prefix_len
from asymagent.request import GenerationRequest
from asymagent.results import ChatResult, GenerationResult
from asymagent.spec_config import mode_of

log = logging.getLogger(__name__)
LOGPROB_CHUNK = 256  # positions per drafter forward: [256, V] log-probs at a time, not [T, V]
# the drafter's last rows whose attention scores the history (attention keep): the generation
# prompt and the end of the newest message (Speculative Prefill reads the prompt's last tokens)
ATTENTION_ROWS = 8


def conversation_views(engine, cache_key: str, template_kwargs: dict | None = None
                       ) -> ContextViews:
    """The ContextViews of one conversation (append-stable views; same LRU as the caches),
    rendered with the chat template's extra variables `template_kwargs` (built anew when they
    change)."""
    conv = engine.conversation(cache_key)
    chat_format = engine.chat_format_for(template_kwargs)
    if conv.views is None or conv.views.chat_format is not chat_format:
        conv.views = ContextViews(engine.tokenizer, engine.compression, chat_format)
    return conv.views


def drafter_logprob_fn(engine, cache_key: str, counter: list) -> Callable[[list], list]:
    """logprob_fn(full_ids) -> log p_drafter(token_t | tokens_<t) for every t (0.0 at t=0),
    computed while prefilling the drafter's full-view cache (so `generate` reuses it).

    Incremental across calls of one conversation: the cache and the stored log-probs are kept up
    to their common prefix with `full_ids`. `counter[0]` is increased by the tokens fed.
    """
    if engine.drafter is None:
        raise ValueError("the drafter log-prob function needs a drafter; this engine has none")
    session = engine.caches.session(cache_key)
    conv = engine.conversation(cache_key)

    @torch.inference_mode()
    def logprob_fn(full_ids: list) -> list:
        cache = session.get("drafter_full")
        kept = min(cache.reuse_prefix(full_ids),
                   common_prefix_len(conv.logprob_ids, full_ids))
        cache.crop(max(kept - 1, 0))  # re-feed one token: its output predicts token `kept`
        start = len(cache)  # kept - 1, or 0 where the crop dropped a sliding-window cache
        head = conv.logprobs[: start + 1] if kept else [0.0]
        ids = full_ids[start:-1]
        counter[0] += len(ids)
        out = list(head)
        for i in range(0, len(ids), LOGPROB_CHUNK):
            hidden = cache.forward_hidden(ids[i:i + LOGPROB_CHUNK])  # [T, H]
            logp = torch.log_softmax(engine.head.full_logits(hidden), dim=-1)  # [T, V]
            targets = torch.tensor(full_ids[start + i + 1:start + i + 1 + len(hidden)],
                                   device=logp.device)  # [T]
            out.extend(logp.gather(1, targets[:, None])[:, 0].tolist())
        conv.logprobs, conv.logprob_ids = out, list(full_ids)
        return out

    return logprob_fn


def drafter_vote_fn(engine, cache_key: str, counter: list, kind: str) -> Callable[[list, list, int, int], float]:
    """vote(full_ids, compressed_ids, a, b) -> how far the full history moves the drafter model
    from token a toward token b at the position after the ids (nats; the margin escalation's vote,
    asymagent/context/recall.py): kind "full": log p_F(b) - log p_F(a) on the full view; "delta":
    that minus the same on the compressed view (what the removed text changes). The drafter's
    caches of both views ("drafter_full", "drafter_compressed") keep their common prefix with the
    ids: only what they lack is fed, and a later step's prefill reuses it. `counter[0]` is
    increased by the tokens fed (the step's drafter prefill)."""
    if engine.drafter is None:
        raise ValueError("recall_vote needs a drafter model (it reads the full history); this engine "
                         "has none: set recall_vote='none' or load a drafter")
    if kind not in ("full", "delta"):
        raise ValueError(f"recall_vote must be 'none', 'full' or 'delta', got {kind!r}")
    session = engine.caches.session(cache_key)

    def next_logprobs(role: str, ids: list) -> torch.Tensor:
        cache = session.get(role)
        cache.reuse_prefix(ids)
        fed = ids[len(cache):]  # at least the last token: its output scores the next position
        counter[0] += len(fed)
        cache.prefill(fed[:-1], desc=f"vote {role}")
        hidden = cache.forward_hidden(fed[-1:])  # [1, H]
        return torch.log_softmax(engine.head.full_logits(hidden)[0].float(), dim=-1)  # [V]

    @torch.inference_mode()
    def vote(full_ids: list, compressed_ids: list, a: int, b: int) -> float:
        lp = next_logprobs("drafter_full", full_ids)
        score = float(lp[b] - lp[a])
        if kind == "delta":
            lc = next_logprobs("drafter_compressed", compressed_ids)
            score -= float(lc[b] - lc[a])
        return score

    return vote


def drafter_reading(engine, cache, full_ids: list, rows: int, lookahead: int = 0,
                    per_layer: bool = False) -> tuple:
    """(capture, look-ahead tokens): the drafter's reading of the end of the full view. `cache`
    (the drafter's full-view cache) holds `full_ids` but its last `rows`; those rows are fed, then
    up to `lookahead` tokens of its own greedy continuation one by one (the first never a stop: an
    empty answer reads nothing; the 0.5B often ranks <|im_end|> first at long agent contexts, then
    the call), all under `capture_attention` (forward 0: the prompt's rows; forwards 1..: the
    look-ahead's). The look-ahead is cropped away again: the cache holds the view."""
    from asymagent.kv.attention import capture_attention
    from asymagent.kv.lean_forward import general_loop

    stops = set(engine.eos_ids)
    ahead: list = []
    with torch.inference_mode(), capture_attention(rows, per_layer=per_layer) as capture, general_loop():
        hidden = cache.forward_hidden(full_ids[len(full_ids) - rows:])  # [rows, H]
        while len(ahead) < lookahead:
            logits = engine.head.full_logits(hidden[-1:])[0]  # [V]
            if not ahead:
                logits[list(stops)] = float("-inf")
            token = int(logits.argmax())
            if token in stops:
                break
            ahead.append(token)
            hidden = cache.forward_hidden([token])  # [1, H]
    cache.crop(len(full_ids))
    return capture, ahead


def drafter_attention_fn(engine, cache_key: str, counter: list, *, lookahead: int = 0,
                         pool: str = "mean", drafted: list | None = None, rows_read: str = "prompt_and_lookahead",
                         layers: str = "all") -> Callable[[list], list]:
    """attention_fn(full_ids) -> [len(full_ids)] the attention the drafter's last ATTENTION_ROWS
    rows, and the rows of its own greedy continuation of up to `lookahead` tokens (Speculative
    Prefill's look-ahead: the tokens that decide the step, not only its prompt), give each
    position of the full view (asymagent/kv/attention.py AttentionCapture, rows pooled by
    `pool`; `drafter_reading`). Computed while prefilling the drafter's full-view cache, which
    keeps the view for the decoding and the next step: only the appended block is fed. The
    look-ahead tokens are left in `drafted` (copied drafts for the verifier: the drafter's reading
    of the whole history, asymagent/decoding/suffix_drafter.py). `counter[0]` is increased by the
    tokens fed. `rows_read` "lookahead" scores by the look-ahead's rows alone (the prompt's where
    it is empty); `layers` "upper" by the upper half of the drafter's layers
    (CompressionConfig.attention_rows / attention_layers)."""
    session = engine.caches.session(cache_key)

    @torch.inference_mode()
    def attention_fn(full_ids: list, rows: int | None = None) -> list:
        """`rows`: the last rows read (None: ATTENTION_ROWS; margin_readmit reads the answer's)."""
        cache = session.get("drafter_full")
        rows = min(rows or ATTENTION_ROWS, len(full_ids))
        cache.crop(min(cache.reuse_prefix(full_ids), len(full_ids) - rows))
        counter[0] += len(full_ids) - len(cache)
        cache.prefill(full_ids[len(cache):len(full_ids) - rows])
        capture, ahead = drafter_reading(engine, cache, full_ids, rows, lookahead, per_layer=layers == "upper")
        counter[0] += len(ahead)
        if drafted is not None:
            drafted[:] = ahead
        picked = range(capture.layers // 2, capture.layers) if layers == "upper" else None
        read = slice(1, None) if rows_read == "lookahead" and ahead else slice(None)  # forward 0: the prompt's rows
        return capture.scores(len(full_ids), pool, picked, read)

    return attention_fn


def _check_messages(engine, messages) -> None:
    """Raise a ValueError naming the problem, before any view, cache or forward is made."""
    if engine.tokenizer is None:
        raise ValueError("chat needs a tokenizer; this engine has none (use generate)")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role', 'content'} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ValueError(f"messages[{i}] must be a dict with a 'role'")


def build_constraint(engine, tools: list | None, tool_choice, response_format,
                     parallel: bool = False):
    """The request's constraint: a forced call (tool_choice required/named) is decoded under
    ToolCallConstraint; else a JSON response_format under ResponseFormatConstraint (which admits
    calls instead when tools are offered); else, with tools under "auto", AutoToolConstraint
    (free text, or a call held to the tools from its marker on); else None. `parallel`: 1..8
    calls, else one. xgrammar is imported only when asked."""
    if tool_choice not in (None, "auto", "none"):
        from asymagent.chat.tool_constraint import ToolCallConstraint

        return ToolCallConstraint(engine.tokenizer, tools, tool_choice,
                                  vocab_size=engine.vocab_size, parallel=parallel)
    if format_schema(response_format) is None:
        return auto_constraint(engine, tools, parallel) if tools and tool_choice != "none" \
            else None
    return ResponseFormatConstraint(engine.tokenizer, response_format,
                                    tools=tools if tool_choice != "none" else None,
                                    vocab_size=engine.vocab_size, parallel=parallel)


def auto_constraint(engine, tools: list, parallel: bool):
    """AutoToolConstraint for tools under "auto"; None (decoding unconstrained, as before) when
    a tool's schema cannot be compiled into a grammar (logged): "auto" never refuses a request
    a forced call would refuse."""
    from asymagent.chat.schema_refs import ToolSchemaError

    try:
        return AutoToolConstraint(engine.tokenizer, tools, vocab_size=engine.vocab_size,
                                  parallel=parallel)
    except ToolSchemaError as exc:
        log.warning("tool_choice auto decodes unconstrained: %s", exc)
        return None


def offered_names(tools: list | None) -> list | None:
    """The names of the offered tools (OpenAI or bare function dicts); None without tools."""
    if not tools:
        return None
    fns = [t.get("function", t) if isinstance(t, dict) else {} for t in tools]
    return [f.get("name") for f in fns if isinstance(f, dict) and f.get("name")]


@dataclass
class ChatTurn:
    """One chat request made ready for decoding (`prepare_chat`)."""

    full_ids: list  # the drafter's full view
    compressed_ids: list | None  # the verifier's view in compressed modes (None: the full view)
    constraint: object  # TokenConstraint from tool_choice / response_format, or None
    rewrites: int  # earlier messages whose compressed form changed (StepStats.rewrites)
    drafter_tokens: list  # [tokens the drafter fed for surprisal log-probs]
    parallel_tool_calls: bool | None = None  # the request's (False: at most one call kept)
    tool_names: list | None = None  # the offered tools' names (a call must name one); None: any
    lookahead: list = field(default_factory=list)  # the drafter's look-ahead (attention keep)
    # the tokens of the turn's last recall pass: a margin escalation's full-view pass (mode spec,
    # lossless) is offered them as copied drafts, so the output before the hesitation, where the
    # two views agree, is verified in long rounds instead of decoded again token by token
    last_pass: list = field(default_factory=list)


def _views_of(engine, request: GenerationRequest, counter: list, drafted: list | None = None) -> tuple:
    """(the conversation's ContextViews, the drafter's log-prob function or None, its attention
    function or None: attention keep, asymagent/context/attention_keep.py). The drafter's
    log-probs feed surprisal compression (only called when one is configured and new messages
    need them; `counter` sums the tokens fed); offered in every mode so one conversation's
    compressed view does not depend on the mode of its first call."""
    views = conversation_views(engine, request.cache_key, request.chat_template_kwargs)
    logprob_fn = drafter_logprob_fn(engine, request.cache_key, counter) \
        if engine.drafter is not None else None
    # attention keep: only where the verifier reads the compressed view (modes compressed and
    # asym); mode full and spec never pay the drafter's prefill for a view they do not read
    attention_fn = None
    if logprob_fn is not None and mode_of(request.mode).compressed and views.config.reads_attention():
        attention_fn = drafter_attention_fn(engine, request.cache_key, counter,
                                            lookahead=views.config.attention_lookahead,
                                            pool=views.config.attention_pool, drafted=drafted,
                                            rows_read=views.config.attention_rows,
                                            layers=views.config.attention_layers)
    return views, logprob_fn, attention_fn


def prepare_chat(engine, messages: list, request: GenerationRequest) -> ChatTurn:
    """Validate the messages, build the constraint and both views of the conversation."""
    _check_messages(engine, messages)
    constraint = build_constraint(engine, request.tools, request.tool_choice,
                                  request.response_format,
                                  parallel=bool(request.parallel_tool_calls))
    counter = [0]
    drafted: list = []  # the drafter's look-ahead (attention keep), offered as copied drafts
    views, logprob_fn, attention_fn = _views_of(engine, request, counter, drafted)
    pair = views.build(messages, request.tools, logprob_fn=logprob_fn, attention_fn=attention_fn)
    compressed = pair.compressed_ids if mode_of(request.mode).compressed else None
    return ChatTurn(full_ids=pair.full_ids, compressed_ids=compressed, constraint=constraint,
                    rewrites=pair.rewrites, drafter_tokens=counter,
                    parallel_tool_calls=request.parallel_tool_calls,
                    tool_names=offered_names(request.tools), lookahead=drafted)


def verifier_view_tokens(engine, messages: list, request: GenerationRequest) -> int | None:
    """Tokens of the compressed view the verifier will read for this chat request (modes
    compressed and asym; None in full and spec, whose verifier reads the full view), without
    decoding: a server admits a conversation whose full view is over the model's context when
    this view fits (the drafter reads the full view however long; Engine's ContextLengthError).
    The drafter log-probs a surprisal compressor asks for here are not counted in a StepStats."""
    if not mode_of(request.mode).compressed:
        return None
    _check_messages(engine, messages)
    with engine.lock:
        views, logprob_fn, attention_fn = _views_of(engine, request, [0])
        return views.verifier_tokens(messages, request.tools, logprob_fn=logprob_fn,
                                     attention_fn=attention_fn)


def recall_step(engine, turn: ChatTurn, request: GenerationRequest,
                decode: Callable[[list, object, bool], GenerationResult]) -> GenerationResult:
    """Decode a turn with recall on evidence (asymagent/context/recall.py): during decoding, at
    most `CompressionConfig.max_recalls` times (0, the default: one plain pass); not while
    streaming (the callback would already have sent the interrupted pass's tokens) and not on an
    uncompressed turn. `decode(compressed_ids, interrupt, full)` decodes the turn on a verifier
    view (full: on the full view, mode spec), the decode loop calling `interrupt` (None: no watch)
    with each pass's new tokens."""
    views = conversation_views(engine, request.cache_key, request.chat_template_kwargs)
    if turn.compressed_ids is None or not views.config.max_recalls or request.callback is not None:
        return decode(turn.compressed_ids, None, False)
    passes = [0]

    def again(compressed_ids: list, interrupt, full: bool = False) -> GenerationResult:
        if passes[0] and turn.constraint is not None:
            turn.constraint.reset()  # the turn is decoded again from its first token
        passes[0] += 1
        result = decode(compressed_ids, interrupt, full)
        turn.last_pass = list(result.token_ids)
        return result

    config = views.config
    vote = None  # the drafter's vote on a margin escalation (CompressionConfig.recall_vote)
    if config.recall_evidence == "margin" and config.recall_vote != "none":
        vote = drafter_vote_fn(engine, request.cache_key, turn.drafter_tokens, config.recall_vote)
    readmit = None  # re-admission at a hesitation: the drafter's attention at that token
    if config.recall_evidence == "margin_readmit":
        if engine.drafter is None:
            raise ValueError("recall_evidence 'margin_readmit' reads the drafter model's attention; "
                             "this engine has none")
        attention = drafter_attention_fn(engine, request.cache_key, turn.drafter_tokens,
                                         pool=config.attention_pool, layers=config.attention_layers)
        prompt = len(turn.full_ids)

        def readmit(prefix_ids: list) -> list:
            # attention_rows "lookahead": the rows of the answer so far (the verifier's own tokens
            # up to the hesitation, at least ATTENTION_ROWS rows), read by the drafter over the full
            # history: the tokens that decide the step, as the look-ahead's are at a step's start
            rows = max(ATTENTION_ROWS, len(prefix_ids) - prompt) if config.attention_rows == "lookahead" else None
            return views.readmit_at(attention(prefix_ids, rows))
    return recall_loop(views, turn.full_ids, turn.compressed_ids, again,
                       evidence=config.recall_evidence, min_len=engine.spec.copy_min_len,
                       scope=config.recall_scope, max_tokens=config.recall_max_tokens,
                       margin=config.recall_margin, limit=getattr(engine, "max_positions", 0),
                       vote=vote, vote_min=config.recall_vote_min, readmit=readmit,
                       escalation=config.recall_escalation)


def chat_result(engine, turn: ChatTurn, result: GenerationResult) -> ChatResult:
    """The decoded tokens as a ChatResult: text, tool calls, finish reason, stats."""
    stats = result.stats
    stats.rewrites += turn.rewrites
    stats.drafter_prefill_tokens += turn.drafter_tokens[0]
    constraint = turn.constraint
    if isinstance(constraint, ResponseFormatConstraint):
        parsed = split_output(result.text, [f["name"] for f in constraint.functions],
                              max_calls=constraint.max_calls)
    else:
        parsed = engine.chat_format.parse_output(result.text, tool_names=turn.tool_names)
    if turn.parallel_tool_calls is False:
        del parsed.tool_calls[1:]  # OpenAI's parallel_tool_calls=false: at most one call
    finish = result.finish_reason
    if parsed.tool_calls and finish == "stop":
        finish = "tool_calls"
    stats.finish_reason = finish
    return ChatResult(token_ids=result.token_ids, text=parsed.content, stats=stats,
                      finish_reason=finish, tool_calls=parsed.tool_calls,
                      invalid_tool_calls=parsed.invalid_tool_calls, logprobs=result.logprobs)
