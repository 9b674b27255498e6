"""Prometheus metrics for the OpenAI-compatible server, named after vLLM's where vLLM has one.

Every metric lives in a per-app `CollectorRegistry` (so tests can build several apps in one
process) and carries the `asymagent:` prefix the way vLLM's carry `vllm:`. Counters get the
`_total` suffix from prometheus-client on exposition, e.g. `asymagent:spec_decode_num_drafts_total`.

Speculation counters follow vLLM's definitions:
  num_drafts            draft proposals (one per speculative round = one verifier forward),
  num_draft_tokens      draft tokens proposed,
  num_accepted_tokens   draft tokens accepted,
  num_accepted_tokens_per_pos{position}  accepted drafts at draft position i (0-based).
Extension: draft_source_steps{source}  decode steps by drafter (StepStats.draft_source).
Per draft source (issue 56; StepStats.by_source), the same counters with a `source` label
(suffix, lookup, model, feature): spec_decode_num_drafts_by_source, ..._num_draft_tokens_by_source,
..._num_accepted_tokens_by_source, ..._num_accepted_tokens_per_pos_by_source{source, position}.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)

PREFIX = "asymagent:"
# Latency buckets in seconds: CPU decoding spans ~10 ms (one token, tiny model) to minutes.
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                    160.0, 320.0)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def accepted_per_position(stats) -> list[int]:
    """Accepted draft counts per position from a StepStats.

    `acceptance_by_position[i]` is accepted-at-i / rounds-reaching-i. A round reaches position
    i+1 exactly when its draft i was accepted, so reached[0] = rounds and
    accepted[i] = rate[i] * reached[i] = reached[i+1]. Counts are rounded back to integers.
    """
    reached_list = stats.reached_by_position
    out: list[int] = []
    reached = float(stats.rounds)
    for i, rate in enumerate(stats.acceptance_by_position or []):
        if reached_list:
            reached = float(reached_list[i])
        accepted = rate * reached
        out.append(int(round(accepted)))
        reached = accepted
    return out


class ServerMetrics:
    """All server metrics on one registry; `observe(stats)` records a finished request."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        r, p, lbl = self.registry, PREFIX, ["model_name"]
        self.num_drafts = Counter(p + "spec_decode_num_drafts", "Speculative draft proposals "
                                  "(one per verifier round).", lbl, registry=r)
        self.num_draft_tokens = Counter(p + "spec_decode_num_draft_tokens",
                                        "Draft tokens proposed.", lbl, registry=r)
        self.num_accepted_tokens = Counter(p + "spec_decode_num_accepted_tokens",
                                           "Draft tokens accepted.", lbl, registry=r)
        self.num_accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos",
                                            "Accepted draft tokens by draft position.",
                                            lbl + ["position"], registry=r)
        by = lbl + ["source"]
        self.src_drafts = Counter(p + "spec_decode_num_drafts_by_source", "Speculative rounds "
                                  "by draft source.", by, registry=r)
        self.src_draft_tokens = Counter(p + "spec_decode_num_draft_tokens_by_source",
                                        "Draft tokens proposed, by draft source.", by, registry=r)
        self.src_accepted = Counter(p + "spec_decode_num_accepted_tokens_by_source",
                                    "Draft tokens accepted, by draft source.", by, registry=r)
        self.src_accepted_per_pos = Counter(p + "spec_decode_num_accepted_tokens_per_pos_by_source",
                                            "Accepted draft tokens by draft source and position.",
                                            by + ["position"], registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to first token "
                              "(request received -> first token), seconds.", lbl,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram(p + "e2e_request_latency_seconds", "Request latency (received -> "
                             "finished, queue wait included), seconds.", lbl,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(p + "request_queue_time_seconds", "Time spent waiting for "
                                    "the engine worker, seconds.", lbl,
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram(p + "time_per_output_token_seconds", "Decode time per output "
                              "token after the first, seconds.", lbl, buckets=_TOKEN_BUCKETS,
                              registry=r)
        self.compression = Histogram(p + "compression_ratio", "Verifier context / full context "
                                     "tokens per request.", lbl, buckets=_RATIO_BUCKETS,
                                     registry=r)
        self.escalations = Counter(p + "escalations", "Responses finished by the verifier on "
                                   "the full context (escalate_jsd).", lbl, registry=r)
        # issue 26: removed text brought back into the verifier's view (CompressionConfig.max_recalls)
        self.recalls = Counter(p + "recalls", "Recalls: tool outputs restored into the verifier's "
                               "view on copy evidence, the step decoded again.", lbl, registry=r)
        self.recall_prefill = Counter(p + "recall_prefill_tokens", "Verifier tokens prefilled for "
                                      "recalls (also counted in the prefill figures).", lbl, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt (full-context) tokens.", lbl,
                                     registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens.", lbl,
                                         registry=r)
        # vLLM's prefix-cache pair (tokens): what the verifier's view asked for, what it reused.
        self.prefix_queries = Counter(p + "prefix_cache_queries", "Verifier prompt tokens looked "
                                      "up in the conversation's KV cache.", lbl, registry=r)
        self.prefix_hits = Counter(p + "prefix_cache_hits", "Verifier prompt tokens reused from "
                                   "the KV cache (not prefilled).", lbl, registry=r)
        self.success = Counter(p + "request_success", "Finished requests by finish reason.",
                               lbl + ["finished_reason"], registry=r)
        self.aborted = Counter(p + "request_aborted", "Generations cancelled because the "
                               "client went away.", lbl, registry=r)
        self.aborted_tokens = Counter(p + "aborted_generation_tokens", "Tokens generated for "
                                      "requests that were then cancelled.", lbl, registry=r)
        self.errors = Counter(p + "request_errors", "Requests answered with an error, by HTTP "
                              "status.", lbl + ["status"], registry=r)
        self.draft_source = Counter(p + "draft_source_steps", "Decode steps by what drafted them "
                                    "(suffix, lookup, model; plain = no draft).",
                                    lbl + ["source"], registry=r)
        self.waiting = Gauge(p + "num_requests_waiting", "Requests queued for the engine "
                             "worker (queue depth).", lbl, registry=r)
        self.running = Gauge(p + "num_requests_running", "Requests the engine is generating.",
                             lbl, registry=r)
        # continuous batching (Engine(max_num_seqs=N), asymagent/scheduling/): per model forward
        # of a round, the tokens it fed (vLLM's iteration_tokens_total) and the sequences in it
        self.iteration_tokens = Histogram(p + "iteration_tokens_total", "Tokens (rows) per model "
                                          "forward, all its sequences together.", lbl,
                                          buckets=_BATCH_BUCKETS, registry=r)
        self.iteration_sequences = Histogram(p + "iteration_sequences", "Sequences (requests) "
                                             "per model forward: the batch size.", lbl,
                                             buckets=_BATCH_BUCKETS, registry=r)
        # Touch label sets so the series exist (at zero) before the first request.
        for metric in (self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                       self.escalations, self.recalls, self.recall_prefill,
                       self.prompt_tokens, self.generation_tokens,
                       self.prefix_queries, self.prefix_hits, self.aborted, self.aborted_tokens, self.waiting, self.running):
            metric.labels(model_name)

    def observe(self, stats, *, e2e_s: float, ttft_s: float | None, queue_s: float,
                finish_reason: str) -> None:
        """Record one finished generation (`stats` is the engine's StepStats)."""
        m = self.model_name
        if stats.drafted:
            self.num_drafts.labels(m).inc(stats.rounds)
            self.num_draft_tokens.labels(m).inc(stats.drafted)
            self.num_accepted_tokens.labels(m).inc(stats.accepted)
            for pos, count in enumerate(accepted_per_position(stats)):
                self.num_accepted_per_pos.labels(m, str(pos)).inc(count)
        for source, count in (getattr(stats, "draft_source", None) or {}).items():
            self.draft_source.labels(m, source).inc(count)
        for source, d in (getattr(stats, "by_source", None) or {}).items():
            self.src_drafts.labels(m, source).inc(d.get("rounds", 0))
            self.src_draft_tokens.labels(m, source).inc(d.get("drafted", 0))
            self.src_accepted.labels(m, source).inc(d.get("accepted", 0))
            for pos, count in enumerate(d.get("accepted_by_position", [])):
                self.src_accepted_per_pos.labels(m, source, str(pos)).inc(count)
        self.e2e.labels(m).observe(e2e_s)
        self.queue_time.labels(m).observe(queue_s)
        if ttft_s is not None:
            self.ttft.labels(m).observe(ttft_s)
        if stats.new_tokens > 1:
            self.tpot.labels(m).observe(stats.decode_s / (stats.new_tokens - 1))
        self.compression.labels(m).observe(stats.compression_ratio)
        if stats.escalated:
            self.escalations.labels(m).inc()
        self.recalls.labels(m).inc(getattr(stats, "recalls", 0))
        self.recall_prefill.labels(m).inc(getattr(stats, "recall_prefill_tokens", 0))
        self.prompt_tokens.labels(m).inc(stats.full_context_tokens)
        self.prefix_queries.labels(m).inc(stats.verifier_context_tokens)
        self.prefix_hits.labels(m).inc(stats.cached_tokens)
        self.generation_tokens.labels(m).inc(stats.new_tokens)
        self.success.labels(m, finish_reason).inc()

    def forward(self, sequences: int, rows: int) -> None:
        """Record one model forward of the engine's batcher (ForwardBatcher.observers)."""
        self.iteration_sequences.labels(self.model_name).observe(sequences)
        self.iteration_tokens.labels(self.model_name).observe(rows)

    def abort(self, generated_tokens: int) -> None:
        """Record a generation cancelled by a client disconnect."""
        self.aborted.labels(self.model_name).inc()
        self.aborted_tokens.labels(self.model_name).inc(generated_tokens)

    def error(self, status: int) -> None:
        self.errors.labels(self.model_name, str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
