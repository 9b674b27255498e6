"""Local `$ref` handling for tool schemas: re-rooting, refusal of what the grammar cannot serve."""

from __future__ import annotations

import pytest

from asymagent.chat.schema_refs import ToolSchemaError, check_refs, has_refs, rebase_refs, resolve
from asymagent.chat.tool_constraint import tool_call_schema

PERSON = {"type": "object", "required": ["home"], "properties": {
    "home": {"$ref": "#/$defs/Address"},
    "friends": {"type": "array", "items": {"$ref": "#"}},
    "tag": {"const": {"$ref": "#/not/a/schema"}}},  # data, not a reference
    "$defs": {"Address": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_rebase_rewrites_local_refs_only():
    out = rebase_refs(PERSON, "#/$defs/args")
    assert out["properties"]["home"] == {"$ref": "#/$defs/args/$defs/Address"}
    assert out["properties"]["friends"]["items"] == {"$ref": "#/$defs/args"}
    assert out["properties"]["tag"] == PERSON["properties"]["tag"]  # const left alone
    assert PERSON["properties"]["home"] == {"$ref": "#/$defs/Address"}  # input untouched


def test_call_schema_keeps_refs_resolvable():
    fns = [{"name": "p", "parameters": PERSON},
           {"name": "q", "parameters": {"type": "object", "properties": {}}}]
    schema = tool_call_schema(fns)
    branch = schema["anyOf"][0]
    target = resolve(schema, branch["properties"]["arguments"]["$ref"])
    assert resolve(schema, target["properties"]["home"]["$ref"])["properties"]["city"]
    assert "$ref" not in str(schema["anyOf"][1])  # ref-free parameters are inlined as before
    assert not has_refs(fns[1]["parameters"]) and has_refs(PERSON)


def test_json_pointer_escapes():
    schema = {"$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}, "e f": {}}}
    assert resolve(schema, "#/$defs/a~1b") == {"type": "string"}
    assert resolve(schema, "#/$defs/c~0d") == {"type": "integer"}
    assert resolve(schema, "#/$defs/e%20f") == {}


@pytest.mark.parametrize("schema, words", [
    ({"properties": {"n": {"$ref": "#"}}, "required": ["n"]}, "no finite instance"),
    ({"properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"$ref": "#/$defs/A"}}},
     "circular"),
    ({"properties": {"a": {"$ref": "#/$defs/B"}}}, "points at nothing"),
    ({"properties": {"a": {"$ref": "other.json#/x"}}}, "not a local reference"),
    ({"properties": {"a": {"type": "array", "minItems": 2, "items": False}},
      "required": ["a"]}, "no finite instance"),
])
def test_check_refuses(schema, words):
    with pytest.raises(ToolSchemaError, match=words):
        check_refs({"type": "object", **schema})


def test_check_accepts_recursion_with_a_way_out_and_bounds_depth():
    check_refs(PERSON)  # friends may be [] and is not required
    check_refs({"type": "object", "required": ["n"], "properties": {
        "n": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}})
    deep = inner = {"type": "object", "properties": {}}
    for _ in range(100):
        inner["properties"]["a"] = {"type": "object", "properties": {}}
        inner = inner["properties"]["a"]
    with pytest.raises(ToolSchemaError, match="deeper than"):
        check_refs(deep)
