"""Engine config files: a JSON/YAML mapping with `spec` (SpecConfig fields) and/or `compression`
(CompressionConfig), read by `asymagent serve --config`, `Engine.from_default(config=...)`,
`Engine.from_pretrained(config=...)` and `ChatAsymSpec.from_default(config=...)`; `asymagent tune
--write-config` writes one. An optional `tuned` section records where a tuned file came from and
is not read.

    {"spec": {"k": 2, "acceptance": "greedy", ...},
     "compression": {"compressors": [{"type": "tool_output", "head_tokens": 128, "tail_tokens": 64}]},
     "tuned": {"traces": "runs/traffic", "speedup_vs_full": 1.6, "fidelity_vs_full": 0.93, ...}}
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

SECTIONS = ("spec", "compression", "tuned")


def read_config(path: str):
    """(SpecConfig | None, CompressionConfig | None) from a config file; ValueError naming the
    file and the section for anything unknown or invalid."""
    from asymagent.context.compressors import CompressionConfig
    from asymagent.spec_config import SpecConfig

    path = str(path)
    text = pathlib.Path(path).read_text()
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as exc:  # yaml.YAMLError / json.JSONDecodeError
        raise ValueError(f"{path}: not valid {'YAML' if path.endswith(('.yaml', '.yml')) else 'JSON'}"
                         f": {exc}") from None
    if not isinstance(data, dict) or set(data) - set(SECTIONS):
        raise ValueError(f"{path}: expected a mapping with 'spec' and/or 'compression', got "
                         f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")
    spec = compression = None
    if "spec" in data:
        fields = {f.name for f in dataclasses.fields(SpecConfig)}
        if not isinstance(data["spec"], dict) or set(data["spec"]) - fields:
            unknown = sorted(set(data["spec"]) - fields) if isinstance(data["spec"], dict) else []
            raise ValueError(f"{path}: spec: unknown key(s) {unknown}; SpecConfig has "
                             f"{', '.join(sorted(fields))}")
        try:
            spec = SpecConfig(**data["spec"])
            spec.validate()
        except (TypeError, ValueError) as exc:  # a value of the wrong type or out of range
            raise ValueError(f"{path}: spec: {exc}") from None
    if "compression" in data:
        try:
            compression = CompressionConfig.model_validate(data["compression"])
        except ValueError as exc:  # pydantic's ValidationError
            raise ValueError(f"{path}: compression: {exc}") from None
    return spec, compression


def write_config(path: str, spec, compression, tuned: dict | None = None) -> None:
    """Write a config file `read_config` reads back to equal objects (JSON, or YAML by suffix)."""
    data = {"spec": spec.to_dict(), "compression": compression.model_dump(mode="json")}
    if tuned is not None:
        data["tuned"] = tuned
    path = str(path)
    if path.endswith((".yaml", ".yml")):
        import yaml

        text = yaml.safe_dump(data, sort_keys=False)
    else:
        text = json.dumps(data, indent=2) + "\n"
    pathlib.Path(path).write_text(text)


def engine_settings(config, spec=None, compression=None) -> tuple:
    """(spec, compression) for an Engine constructor: explicit arguments win over the file's."""
    if config is None:
        return spec, compression
    file_spec, file_compression = read_config(config)
    return (spec if spec is not None else file_spec,
            compression if compression is not None else file_compression)
