"""StaticKV: one model's KV cache in fixed-capacity buffers, read by forwards of static shapes.

The CUDA decode path (docs/kernels.md, "Decode without launch overhead"). Eager transformers
spends most of a small model's decode step launching kernels from Python (measured on an H200:
a 0.34B model's one-token forward 26.5 ms eager against ~0.2 ms of weight reads). A CUDA graph
replays a recorded forward with one launch, but only if every shape and every buffer address is
the same each time. So here:

- keys and values live in `[1, H_kv, C, D]` buffers of fixed capacity C per layer, allocated once
  (`StaticKVLayer`); a forward of T tokens writes them at positions `length + arange(T)` with
  `index_copy_` and attention reads all C positions under a `[1, 1, T, C]` mask (`j <= position`),
  so the shapes depend on T and C only, never on the cached length;
- the cached length is a device scalar (`StaticKV.length`) updated inside the forward; the host
  keeps a mirror (`len(kv)`) for capacity checks. Nothing in a forward syncs with the host;
- `crop(n)` (rollback after rejected drafts, prefix reuse) only moves the length back: positions
  past it are masked out and overwritten by the next forward (as transformers' StaticLayer);
- when a forward would not fit, the buffers are reallocated larger (x GROWTH, + HEADROOM, to a
  multiple of ALIGN) with one copy, and every graph captured on the old buffers is dropped.

`StaticKV.run(ids, head)` is the forward the engine calls: a CUDA graph per (T, head) when
`options.graphs` (asymagent/kv/cuda_graphs.py, captured on first use), else the same static-shape
forward eagerly (what the CPU tests exercise). Values equal the dynamic cache's up to float
reduction order (attention sums over C masked positions instead of the length).

Sliding-window layers (Mistral, Gemma 3's local layers, Qwen with `use_sliding_window`) keep every
position too and read a band mask (`j <= position` and `j > position - window`): the same keys
as transformers' sliding layer, and crop/rollback work anywhere. A model with `layer_types` gets
the masks by type (`{"full_attention": ..., "sliding_attention": ...}`, which those forwards take
as given); one without (Mistral, Phi-3: every layer sliding) gets the band mask alone.

Supported: decoder models whose layers are full or sliding attention under `sdpa` (our GQA
sdpa included), e.g. Llama, Qwen2/3, Mistral, Gemma 3, SmolLM2; `static_kv_unsupported` says why
not otherwise, and the engine keeps the dynamic cache for them.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

GROWTH = 1.5  # a full buffer is reallocated at this multiple of its capacity...
HEADROOM = 256  # ...and with at least this many free positions (the first allocation too)
ALIGN = 256  # capacities are a multiple of this many positions (fewer distinct graph shapes)
ATTENTION = ("sdpa", "asymagent_sdpa")  # a boolean [1, 1, T, C] mask is what these read
LAYER_TYPES = ("full_attention", "sliding_attention")  # sliding layers read a band mask (step)


@dataclass
class StaticKVOptions:
    """How a ModelCache's StaticKV runs (Engine(cuda_graphs=...) / Engine(static_kv=...))."""

    graphs: bool = False  # capture CUDA graphs (CUDA only) for forwards of <= max_graph_tokens
    max_graph_tokens: int = 16  # K+1 verify rows up to K = 15; prefill chunks stay eager
    compile: bool = False  # torch.compile those forwards instead (CPU; asymagent/kv/compiled_forward.py)
    # speculative rounds as one static-shape call (asymagent/decoding/graph_round.py): drafter
    # steps, verify, base pass and gate on the device, one device->host copy per round (captured
    # as one CUDA graph per K with `graphs`; eager, the same code, without). ASYMAGENT_GRAPH_ROUND=0
    # turns it off (rounds then run step by step as before); the compiled CPU path keeps its
    # step-by-step rounds (each forward compiled).
    rounds: bool = True


def sliding_window_of(config) -> int | None:
    """The sliding window of a model's local layers (every layer's, for a model without
    `layer_types` such as Mistral), or None where every layer attends to the whole context."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    window = getattr(text, "sliding_window", None)
    if not window or not getattr(text, "use_sliding_window", True):
        return None
    types = getattr(text, "layer_types", None)
    return int(window) if types is None or "sliding_attention" in types else None


def static_kv_unsupported(model: torch.nn.Module) -> str | None:
    """Why `model` cannot use a StaticKV, or None if it can."""
    config = getattr(model, "config", None)
    if config is None:
        return f"{type(model).__name__} has no config"
    impl = getattr(config, "_attn_implementation", None)
    if impl not in ATTENTION:
        return f"attention implementation {impl!r} (static KV needs one of {ATTENTION})"
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None) or ["full_attention"]
    if any(t not in LAYER_TYPES for t in types):
        return f"layer types {sorted(set(types))} (static KV supports {LAYER_TYPES})"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model"
    return None


def _capacity(needed: int, old: int) -> int:
    cap = max(needed + HEADROOM, int(old * GROWTH))
    return -(-cap // ALIGN) * ALIGN


class StaticKVLayer(CacheLayerMixin):
    """One layer's keys/values in `[1, H_kv, C, D]` buffers, written where its StaticKV says."""

    is_compileable = True
    is_croppable = True
    is_sliding = False

    def __init__(self, owner: "StaticKV", keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.owner = owner
        self.keys, self.values = keys, values  # [1, H_kv, C, D]
        self.device = keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """The buffers are allocated by StaticKV before any forward."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write key/value states [1, H_kv, T, D] at the forward's positions; return all C."""
        where = self.owner.write_at  # [T] positions of this forward's tokens
        self.keys.index_copy_(2, where, key_states)
        self.values.index_copy_(2, where, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> torch.Tensor:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.keys.shape[2]

    def crop(self, tokens_to_remove: int) -> None:
        self.owner.crop(tokens_to_remove)


class StaticKV(Cache):
    """A model's KV cache of fixed capacity with static-shape forwards (see the module docstring).

    `run(ids, head=True)` feeds token ids and returns fresh float32 logits [T, V] (head=False:
    the decoder body's final hidden states [T, H]); `crop(n)` removes -n positions (n < 0, as
    transformers' DynamicCache.crop) or keeps the first n (n >= 0); `reserve(n)` makes room for
    n positions up front (one reallocation instead of growing mid-request).
    """

    def __init__(self, model: torch.nn.Module, options: StaticKVOptions | None = None) -> None:
        reason = static_kv_unsupported(model)
        if reason is not None:
            raise ValueError(f"static KV cache not supported for this model: {reason}")
        self.model = model
        self.options = options if options is not None else StaticKVOptions()
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        text = model.config.get_text_config(decoder=True)
        self.n_layers = int(text.num_hidden_layers)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        self.head_dim = int(getattr(text, "head_dim", None)
                            or text.hidden_size // text.num_attention_heads)
        self.seen = 0  # host mirror of `length`
        # static state is made outside inference mode: forwards (inference mode) and crops
        # (either mode) may then both update it in place
        with torch.inference_mode(False):
            self.length = torch.zeros((), dtype=torch.long, device=self.device)  # cached positions
            self.positions = torch.arange(0, device=self.device)  # [C]
        self.write_at = self.positions  # [T] set by each forward before the model runs
        self.window = sliding_window_of(model.config)  # local layers' window, None: all global
        text = model.config.get_text_config(decoder=True)
        self.by_type = getattr(text, "layer_types", None) is not None  # masks keyed by layer type
        self.graphs = None  # asymagent.kv.cuda_graphs.GraphSet on the current buffers
        self.generation = 0  # counts reallocations: graphs recorded on older buffers are stale
        super().__init__(layers=[])
        if self.options.graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a model on a CUDA device "
                             f"(this one is on {self.device}); use graphs=False")

    # ------------------------------------------------------------------ bookkeeping
    @property
    def capacity(self) -> int:
        return int(self.positions.shape[0])

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def crop(self, tokens_to_remove: int) -> None:
        """Remove `-n` positions (n < 0, transformers' meaning) or keep the first n (n >= 0)."""
        keep = self.seen + tokens_to_remove if tokens_to_remove < 0 else tokens_to_remove
        keep = max(0, min(keep, self.seen))
        if keep != self.seen:
            self.seen = keep
            self.length.fill_(keep)  # in place: graphs read this address

    @torch.inference_mode(False)
    def reserve(self, total: int) -> None:
        """Make room for `total` positions; a reallocation copies the cache and drops graphs."""
        if total <= self.capacity:
            return
        cap = _capacity(total, self.capacity)
        shape = (1, self.kv_heads, cap, self.head_dim)
        old = self.layers
        self.layers = []
        for i in range(self.n_layers):
            keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
            values = torch.zeros(shape, dtype=self.dtype, device=self.device)
            if old and self.seen:
                keys[:, :, : self.seen].copy_(old[i].keys[:, :, : self.seen])
                values[:, :, : self.seen].copy_(old[i].values[:, :, : self.seen])
            self.layers.append(StaticKVLayer(self, keys, values))
        self.positions = torch.arange(cap, device=self.device)  # [C]
        self.graphs = None  # they hold the old buffers' addresses
        self.generation += 1

    def advance(self, fed: int) -> None:
        """The host mirror follows `fed` positions that a captured call's `step`s wrote."""
        self.seen += int(fed)

    # ------------------------------------------------------------------ forwards
    def step(self, input_ids: torch.Tensor, head: bool) -> torch.Tensor:
        """The static-shape forward of `input_ids` [1, T] (what a CUDA graph records).

        Device work only: positions from the device length, the [1, 1, T, C] mask, the model
        (its layers write K/V at the positions), then the length moves on by T."""
        t = input_ids.shape[1]
        self.write_at = self.length + self.positions[:t]  # [T]
        mask = (self.positions[None, :] <= self.write_at[:, None])[None, None]  # [1, 1, T, C]
        if self.window is not None:  # local layers: the window before each position, itself included
            band = mask & (self.positions[None, :] > self.write_at[:, None] - self.window)[None, None]
            mask = {"full_attention": mask, "sliding_attention": band} if self.by_type else band
        runner = self.model if head else self.model.base_model
        out = runner(input_ids=input_ids, attention_mask=mask, position_ids=self.write_at[None],
                     cache=self, use_cache=True)
        self.length.add_(t)
        return out.logits[0] if head else out.last_hidden_state[0]  # [T, V] / [T, H]

    @torch.inference_mode()
    def run(self, ids: list, head: bool = True) -> torch.Tensor:
        """Feed `ids`; fresh float32 logits [T, V] (head) or hidden states [T, H] in model dtype."""
        t = len(ids)
        self.reserve(self.seen + t)
        cpu_ids = torch.tensor([ids], dtype=torch.long)  # [1, T]
        if self.options.graphs and t <= self.options.max_graph_tokens:
            if self.graphs is None:
                from asymagent.kv.cuda_graphs import GraphSet

                self.graphs = GraphSet(self)
            out = self.graphs.replay(cpu_ids, head)
        elif self.options.compile and t <= self.options.max_graph_tokens:
            from asymagent.kv.compiled_forward import compiled_step

            out = compiled_step(self, cpu_ids.to(self.device), head)
        else:
            out = self.step(cpu_ids.to(self.device), head)
        self.seen += t
        # a graph's output is overwritten by its next replay: hand out a copy
        return out.to(torch.float32, copy=True) if head else out.clone()


def static_roles(models: dict, device: torch.device, *, static_kv: bool = False,
                 cuda_graphs: bool | None = None, compile: bool = False) -> dict:
    """role -> StaticKVOptions for the roles that use a StaticKV (Engine's switch).

    `cuda_graphs=None` reads ASYMAGENT_CUDA_GRAPHS (1/true/on) for a CUDA engine and is off on
    CPU; True on a CPU engine is an error. `static_kv=True` alone runs the static-shape forwards
    eagerly (any device; what CPU tests use); `compile=True` runs them through torch.compile
    (asymagent/kv/compiled_forward.py, the CPU decode path). A model the static cache cannot serve keeps the
    dynamic cache, with a warning naming the reason.
    """
    if cuda_graphs is None:
        env = os.environ.get("ASYMAGENT_CUDA_GRAPHS", "").strip().lower()
        cuda_graphs = device.type == "cuda" and env in ("1", "true", "on", "yes")
    if cuda_graphs and device.type != "cuda":
        raise ValueError(f"cuda_graphs=True needs models on a CUDA device, these are on {device}")
    if not (static_kv or cuda_graphs or compile):
        return {}
    rounds = os.environ.get("ASYMAGENT_GRAPH_ROUND", "1").strip().lower() not in ("0", "false", "off", "no")
    compiled = bool(compile) and not cuda_graphs
    options = StaticKVOptions(graphs=bool(cuda_graphs), compile=compiled,
                              rounds=rounds and not compiled)
    roles = {}
    for role, model in models.items():
        reason = static_kv_unsupported(model)
        if reason is None:
            roles[role] = options
        else:
            warnings.warn(f"{role}: keeping the dynamic KV cache ({reason})")
    return roles
