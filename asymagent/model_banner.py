"""The start banner every face prints: which models an engine runs, in which dtype, on which CPU, and what the probes chose.

`model_banner(engine)` builds one `ModelBanner` (a dataclass; `.text()` is the readable block
`asymagent serve`, `demo`, `bench` and `eval` print when they start): pair or embedded default,
the verifier's and drafter's names, dtype, the CPU kind (asymagent/modeling/cpu_family.py), the
row floors the probes found (attention floor, the linear floors per layer shape: the rows a
few-row bf16 CPU forward is padded to, asymagent/modeling/row_floor.py), whether grouped
attention rows give the same bits as one row (`grouped_rows_exact`), and torch's threads.
The names come from `engine.model_names` (set by `Engine.from_pair`, `from_default`,
`from_pretrained`) unless the caller passes them; otherwise from the models' configs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class ModelBanner:
    """What an engine loaded and what this machine chose for it (see the module docstring)."""

    source: str  # "pair qwen2.5-coder", "embedded default" or "your models"
    verifier: str
    drafter: str
    dtype: str
    cpu_family: str  # one of cpu_family.FAMILIES
    cpu_model: str
    cpu_why: str  # why this dtype on this CPU
    capability: str | None  # torch's vector ISA
    attention_floor: int | None  # None: no floors (not a bf16 CPU model)
    linear_floors: dict = field(default_factory=dict)  # "OUTxIN" -> rows
    grouped_rows_exact: bool | None = None  # None: not probed (float32 / not on the CPU)
    threads: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """The readable block, one fact a line."""
        if self.attention_floor is None:
            floors = "none (row floors apply to bf16 CPU forwards only)"
        else:
            by_floor: dict = {}
            for shape, rows in sorted(self.linear_floors.items()):
                by_floor.setdefault(rows, []).append(shape)
            linear = "; ".join(f"{rows} for {', '.join(shapes)}" for rows, shapes in sorted(by_floor.items()))
            floors = f"attention floor {self.attention_floor}; linear floors {linear or 'none'}"
        exact = {True: "yes", False: "no", None: "not probed"}[self.grouped_rows_exact]
        lines = [
            ("models", self.source),
            ("verifier", self.verifier),
            ("drafter", self.drafter),
            ("dtype", self.dtype),
            ("CPU", f"{self.cpu_family} ({self.cpu_model}; torch ISA {self.capability}); {self.cpu_why}"),
            ("row floors", floors),
            ("grouped rows", f"grouped_rows_exact: {exact}"),
            ("threads", str(self.threads)),
        ]
        width = max(len(k) for k, _ in lines)
        return "\n".join(f"  {k:<{width}} : {v}" for k, v in lines)


def source_names(verifier, drafter) -> dict:
    """{"source", "verifier", "drafter"} of `Engine.from_pretrained`'s sources (its
    `model_names`): a named pair's files ("pair:NAME"), or the sources as given."""
    from asymagent.modeling.pairs import get_pair, pair_name

    name = pair_name(verifier)
    if name is not None:
        pair = get_pair(name)
        return {"source": f"pair {name} ({pair.description})", "verifier": pair.verifier.file_name,
                "drafter": pair.drafter.file_name if drafter is None else str(drafter)}
    return {"source": "your models", "verifier": str(verifier),
            "drafter": "none" if drafter is None else str(drafter)}


def _config_name(model) -> str:
    if model is None:
        return "none"
    config = getattr(model, "config", None)
    name = getattr(config, "_name_or_path", "") or getattr(config, "model_type", "") or type(model).__name__
    return f"{name} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters)"


def model_banner(engine, *, source: str | None = None, verifier: str | None = None,
                 drafter: str | None = None) -> ModelBanner:
    """The banner of `engine` (names: the arguments, else `engine.model_names`, else the configs)."""
    import torch

    from asymagent.kv.attention import grouped_rows_exact
    from asymagent.modeling.cpu_family import cpu_choice

    names = getattr(engine, "model_names", None) or {}
    runtime = getattr(engine, "runtime", {}) or {}
    floors = runtime.get("row_floors")
    weight = next(engine.verifier.parameters())
    exact = None
    if weight.device.type == "cpu" and weight.dtype == torch.bfloat16:
        exact = bool(grouped_rows_exact())
    choice = cpu_choice()
    return ModelBanner(
        source=source or names.get("source") or "your models",
        verifier=verifier or names.get("verifier") or _config_name(engine.verifier),
        drafter=drafter or names.get("drafter") or _config_name(engine.drafter),
        dtype=str(weight.dtype).removeprefix("torch.") + f" on {weight.device.type}",
        cpu_family=choice["family"], cpu_model=choice["cpu_model"] or "unknown model",
        cpu_why=choice["why"], capability=choice["capability"],
        attention_floor=None if floors is None else floors["attention"],
        linear_floors={} if floors is None else dict(floors["linear"]),
        grouped_rows_exact=exact, threads=torch.get_num_threads())
