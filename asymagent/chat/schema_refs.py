"""Local `$ref`s in tool parameter schemas: checked (resolvable, finite, not too deep) and re-rooted.

Tool schemas made by pydantic or `openai.pydantic_function_tool` keep shared and recursive
types under `$defs` and point at them with `{"$ref": "#/$defs/Name"}`, a JSON pointer from the
parameters schema's own root. The tool-call grammar puts each function's parameters *inside* a
call object (`{"name": ..., "arguments": <parameters>}`), where those pointers no longer
resolve. `rebase_refs` rewrites every local pointer `#/...` to `<base>/...` so the parameters
can live at `#/$defs/<key>` of the call schema, `$defs` and recursion included.

`check_refs` refuses, with a ToolSchemaError (a ValueError) naming the place, what the grammar cannot serve:
a pointer to nothing, a remote reference (`http://...`: nothing is fetched), nesting deeper
than `MAX_DEPTH`, and a schema with no finite instance (a required property that refers back to
itself, `{"$ref": "#"}` chains, `allOf` of itself). xgrammar 0.2.9 raises for some of these and
loops forever on the others (measured: `{"properties": {"n": {"$ref": "#"}}, "required": ["n"]}`
never returns from the first token mask), so they must be caught before it sees them.
"""

from __future__ import annotations

from urllib.parse import unquote



class ToolSchemaError(ValueError):
    """A tool's parameters schema cannot be served (unresolvable, infinite, too deep, or refused
    by the grammar compiler); the message names the tool and the place."""


MAX_DEPTH = 64  # nested subschemas; deeper is refused (also bounds the recursion here)
_DATA_KEYS = ("const", "enum", "default", "examples")  # values there are data, not schemas
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def has_refs(schema) -> bool:
    """True when `schema` uses `$ref` anywhere outside data keywords."""
    if isinstance(schema, dict):
        if isinstance(schema.get("$ref"), str):
            return True
        return any(has_refs(v) for k, v in schema.items() if k not in _DATA_KEYS)
    if isinstance(schema, list):
        return any(has_refs(v) for v in schema)
    return False


def rebase_refs(schema, base: str):
    """A copy of `schema` whose local refs `#` / `#/a/b` read `base` / `base/a/b`."""
    if isinstance(schema, list):
        return [rebase_refs(v, base) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and (value == "#" or value.startswith("#/")):
            out[key] = base + value[1:]
        elif key in _DATA_KEYS:
            out[key] = value
        else:
            out[key] = rebase_refs(value, base)
    return out


def resolve(root: dict, ref: str, where: str = "parameters"):
    """The subschema a local `$ref` points at (JSON pointer, `~0` `~1` and %-escapes decoded)."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise ToolSchemaError(f"{where}: $ref {ref!r} is not a local reference ('#' or '#/...'); "
                         "remote schemas are not fetched")
    node = root
    for raw in ref[2:].split("/") if ref != "#" else []:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ToolSchemaError(f"{where}: $ref {ref!r} points at nothing (no {part!r})")
    if not isinstance(node, (dict, bool)):
        raise ToolSchemaError(f"{where}: $ref {ref!r} points at a {type(node).__name__}, not a schema")
    return node


def _subschemas(schema: dict, path: str):
    """(child schema, its path) for every place a JSON schema nests schemas."""
    for key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
        children = schema.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                yield child, f"{path}.{key}.{name}"
    for key in _SCHEMA_LISTS:
        children = schema.get(key)
        if isinstance(children, list):
            for i, child in enumerate(children):
                yield child, f"{path}.{key}[{i}]"
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                "propertyNames", "unevaluatedProperties", "unevaluatedItems"):
        if isinstance(schema.get(key), dict):
            yield schema[key], f"{path}.{key}"


def _check_tree(root: dict, schema, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ToolSchemaError(f"{path}: the schema nests deeper than {MAX_DEPTH} levels")
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        chain, target = [schema["$ref"]], resolve(root, schema["$ref"], path)
        while isinstance(target, dict) and "$ref" in target:  # a ref to a ref to ...
            if target["$ref"] in chain or len(chain) > MAX_DEPTH:
                raise ToolSchemaError(f"{path}: circular $ref chain "
                                      f"{' -> '.join(chain + [target['$ref']])}")
            chain.append(target["$ref"])
            target = resolve(root, target["$ref"], path)
    for child, child_path in _subschemas(schema, path):
        _check_tree(root, child, child_path, depth + 1)


MAX_STEPS = 100_000  # subschema visits the finiteness check may make (adversarial $ref webs)


def _finite(root: dict, schema, stack: tuple, seen: dict) -> bool:
    """Does `schema` have a finite JSON instance? Refs being expanded count as 'no' (least fixed
    point), so a branch that only recurses is not a way out; a 'yes' is always sound and is
    remembered per ref in `seen` (which also counts the steps)."""
    seen["steps"] = seen.get("steps", 0) + 1
    if seen["steps"] > MAX_STEPS:
        raise ToolSchemaError("the schema's $ref structure is too large to check")
    if not isinstance(schema, dict):
        return schema is not False
    sub = lambda s: _finite(root, s, stack, seen)  # noqa: E731
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref not in seen:
        if ref in stack or not _finite(root, resolve(root, ref), stack + (ref,), seen):
            return False
        seen[ref] = True
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches and not any(sub(b) for b in branches):
            return False
    if isinstance(schema.get("allOf"), list) and not all(sub(b) for b in schema["allOf"]):
        return False
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    if not all(sub(props[name]) for name in required if isinstance(name, str) and name in props):
        return False
    min_items = schema.get("minItems") if isinstance(schema.get("minItems"), int) else 0
    prefix = schema.get("prefixItems") if isinstance(schema.get("prefixItems"), list) else []
    if not all(sub(p) for p in prefix[:min_items]):
        return False
    items = schema.get("items")
    if min_items > len(prefix) and isinstance(items, (dict, bool)) and not sub(items):
        return False
    return True


def check_refs(schema: dict, where: str = "parameters") -> None:
    """ToolSchemaError naming the place if `schema` (a tool's parameters) cannot be served; see above."""
    if not isinstance(schema, dict):
        raise ToolSchemaError(f"{where} must be a JSON schema object")
    _check_tree(schema, schema, where, 0)
    if not _finite(schema, schema, ("#",), {}):
        raise ToolSchemaError(f"{where}: the schema has no finite instance (a required property or "
                         "$ref chain refers back to itself with no way out)")
