"""Tools for the agent loop: `@tool` (typed function -> pydantic-validated tool) and schema checks.

    @tool
    def add(a: int, b: int = 0) -> int:
        '''Add two integers.'''
        return a + b

    add.name, add.parameters        # "add", its JSON schema (from a pydantic model of the signature)
    add.invoke({"a": 1, "b": 2})    # ToolOutcome(content="3", error=None, note=None)

`invoke` never raises: bad arguments, a raising function and non-string returns all become a
`ToolOutcome` whose `content` is a clear message for the model. Tools defined only by an
OpenAI JSON schema (evals environments, remote tools) use `Tool.from_schema(schema, func)` and
are checked by `schema_errors`, a small validator for the JSON-schema subset tool schemas use.
Model output is parsed with json.loads, never eval'ed.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pydantic

_JSON_TYPES = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,), "null": (type(None),),
}


def schema_errors(instance: Any, schema: dict, path: str = "arguments") -> list[str]:
    """Violations of `schema` by `instance` (empty list = valid).

    Covers the subset tool schemas use: type (incl. lists), properties, required,
    additionalProperties (bool or schema), items, enum, const, anyOf/oneOf, minimum/maximum,
    exclusiveMinimum/Maximum, minLength/maxLength, minItems/maxItems. Unknown keywords are
    ignored (as JSON schema says); `$ref` is not resolved.
    """
    errs: list[str] = []
    if not isinstance(schema, dict) or not schema:
        return errs
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branch_errs = [schema_errors(instance, s, path) for s in schema[key]]
            ok = sum(1 for e in branch_errs if not e)
            if ok == 0 or (key == "oneOf" and ok > 1):
                errs.append(f"{path}: matches {ok} of the {key} branches")
    if "const" in schema and instance != schema["const"]:
        errs.append(f"{path}: must equal {schema['const']!r}")
    if "enum" in schema and instance not in schema["enum"]:
        errs.append(f"{path}: {instance!r} is not one of {schema['enum']}")
    types = schema.get("type")
    if types is not None:
        names = types if isinstance(types, list) else [types]
        def is_type(t):
            if t in ("integer", "number") and isinstance(instance, bool):
                return False  # JSON true/false are not numbers
            if t == "integer" and isinstance(instance, float):
                return instance.is_integer()
            return isinstance(instance, _JSON_TYPES.get(t, object))
        if not any(is_type(t) for t in names):
            errs.append(f"{path}: expected {' or '.join(names)}, got {type(instance).__name__}")
            return errs
    if isinstance(instance, (int, float)) and not isinstance(instance, bool):
        for key, bad in (("minimum", lambda v, b: v < b), ("maximum", lambda v, b: v > b),
                         ("exclusiveMinimum", lambda v, b: v <= b),
                         ("exclusiveMaximum", lambda v, b: v >= b)):
            if isinstance(schema.get(key), (int, float)) and bad(instance, schema[key]):
                errs.append(f"{path}: {instance} violates {key}={schema[key]}")
    if isinstance(instance, str):
        if "minLength" in schema and len(instance) < schema["minLength"]:
            errs.append(f"{path}: shorter than minLength={schema['minLength']}")
        if "maxLength" in schema and len(instance) > schema["maxLength"]:
            errs.append(f"{path}: longer than maxLength={schema['maxLength']}")
    if isinstance(instance, list):
        if "minItems" in schema and len(instance) < schema["minItems"]:
            errs.append(f"{path}: fewer than minItems={schema['minItems']}")
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            errs.append(f"{path}: more than maxItems={schema['maxItems']}")
        if isinstance(schema.get("items"), dict):
            for i, item in enumerate(instance):
                errs += schema_errors(item, schema["items"], f"{path}[{i}]")
    if isinstance(instance, dict):
        props = schema.get("properties") or {}
        for name in schema.get("required") or []:
            if name not in instance:
                errs.append(f"{path}: missing required property {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, value in instance.items():
            if name in props:
                errs += schema_errors(value, props[name], f"{path}.{name}")
            elif extra is False:
                errs.append(f"{path}: unexpected property {name!r}")
            elif isinstance(extra, dict):
                errs += schema_errors(value, extra, f"{path}.{name}")
    return errs


@dataclass
class ToolOutcome:
    """What a tool call produced, as the tool message content the model will read."""

    content: str
    error: str | None = None  # set when the call did not run or raised
    note: str | None = None  # e.g. "returned dict; sent as JSON"


def to_text(value: Any) -> tuple[str, str | None]:
    """A tool's return value as message text, and a note when it was not already a string."""
    if isinstance(value, str):
        return value, None
    try:
        return json.dumps(value, default=str), f"returned {type(value).__name__}; sent as JSON"
    except (TypeError, ValueError):  # pragma: no cover - default=str makes this rare
        return str(value), f"returned {type(value).__name__}; sent as str()"


@dataclass
class Tool:
    """A callable the agent may run: name, description, JSON schema and a validator."""

    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object
    func: Callable[..., Any]
    args_model: type[pydantic.BaseModel] | None = None  # set by @tool (typed functions)
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("a tool needs a non-empty string name")
        if not callable(self.func):
            raise ValueError(f"tool {self.name!r}: func is not callable")

    def __call__(self, *args, **kwargs):
        return self.func(*args, **kwargs)

    def openai_schema(self) -> dict:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}

    def validate(self, arguments: Any) -> tuple[dict | None, str | None]:
        """(validated keyword arguments, None) or (None, a readable error)."""
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return None, f"arguments are not valid JSON ({exc.msg} at char {exc.pos})"
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
        if self.args_model is not None:
            try:
                model = self.args_model.model_validate(arguments)
            except pydantic.ValidationError as exc:
                parts = [f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                         for e in exc.errors()]
                return None, "; ".join(parts)
            return {k: getattr(model, k) for k in type(model).model_fields}, None
        errs = schema_errors(arguments, self.parameters)
        return (None, "; ".join(errs)) if errs else (arguments, None)

    def invoke(self, arguments: Any) -> ToolOutcome:
        """Validate, run, and turn the result (or the failure) into message text. Never raises."""
        kwargs, error = self.validate(arguments)
        if error is not None:
            return ToolOutcome(f"Error: invalid arguments for tool {self.name!r}: {error}",
                               error=error)
        try:
            value = self.func(**kwargs)
        except Exception as exc:  # a tool's failure is data for the model, not a crash
            msg = f"{type(exc).__name__}: {exc}"
            return ToolOutcome(f"Error: tool {self.name!r} raised {msg}", error=msg)
        text, note = to_text(value)
        return ToolOutcome(text, note=note)

    @classmethod
    def from_schema(cls, schema: dict, func: Callable[..., Any]) -> "Tool":
        """A tool from an OpenAI function schema; `func(**arguments)` runs it."""
        fn = schema.get("function", schema)
        if not isinstance(fn, dict) or not fn.get("name"):
            raise ValueError(f"not an OpenAI function tool schema: {str(schema)[:200]}")
        return cls(name=fn["name"], description=fn.get("description", ""),
                   parameters=fn.get("parameters") or {"type": "object", "properties": {}},
                   func=func)


def _args_model(func: Callable) -> type[pydantic.BaseModel]:
    """A pydantic model of the function's parameters (type hints; defaults -> optional)."""
    sig = inspect.signature(func)
    hints = inspect.get_annotations(func, eval_str=True)
    fields: dict = {}
    for name, param in sig.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"@tool {func.__name__}: *args/**kwargs cannot be described by a schema")
        if name not in hints:
            raise ValueError(f"@tool {func.__name__}: parameter {name!r} needs a type hint")
        default = ... if param.default is param.empty else param.default
        fields[name] = (hints[name], default)
    config = pydantic.ConfigDict(extra="forbid")
    return pydantic.create_model(f"{func.__name__}_args", __config__=config, **fields)


def _clean_schema(schema: dict) -> dict:
    """Drop pydantic's cosmetic titles so prompts stay short."""
    if isinstance(schema, dict):
        return {k: _clean_schema(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_clean_schema(v) for v in schema]
    return schema


def tool(func: Callable | None = None, *, name: str | None = None,
         description: str | None = None):
    """Decorator: a typed function becomes a `Tool` (usable as `@tool` or `@tool(name=...)`)."""

    def wrap(f: Callable) -> Tool:
        model = _args_model(f)
        doc = inspect.getdoc(f) or ""
        desc = description if description is not None else doc.split("\n\n")[0].strip()
        params = _clean_schema(model.model_json_schema())
        params.setdefault("properties", {})
        return Tool(name=name or f.__name__, description=desc, parameters=params, func=f,
                    args_model=model)

    return wrap(func) if func is not None else wrap


def as_tool(obj: Any) -> Tool:
    """A Tool from a Tool, a typed function, or a (schema, func) pair."""
    if isinstance(obj, Tool):
        return obj
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[0], dict):
        return Tool.from_schema(obj[0], obj[1])
    if callable(obj):
        return tool(obj)
    raise ValueError(f"cannot make a tool from {type(obj).__name__}: pass a @tool function, "
                     "a Tool, or (openai_schema, func)")
