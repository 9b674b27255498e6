"""`ChatAsymSpec.with_structured_output`: ChatOpenAI's three methods, each decoded under a grammar.

- "json_schema" (the default, as in ChatOpenAI): the schema goes to the engine as OpenAI's
  `response_format` `{"type": "json_schema", ...}` and the answer is decoded under
  `ResponseFormatConstraint`; the text is parsed into the pydantic model (or a dict).
- "json_mode": `response_format` `{"type": "json_object"}`: any JSON object (the keys come from
  the prompt, as with OpenAI); parsed like json_schema.
- "function_calling": the schema is bound as the one tool and named in tool_choice, so the call
  is decoded under `ToolCallConstraint`; the call's arguments are parsed.
Whatever the model (a 135M verifier included), the text is valid JSON for the schema, so the
parser never sees broken JSON; a response cut by max_tokens is the one way it can still fail.
Pydantic v1 models go through function_calling, as ChatOpenAI sends them.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_openai_function, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic.v1 import BaseModel as BaseModelV1

METHODS = ("json_schema", "json_mode", "function_calling")


def response_format_for(schema: Any, strict: bool | None) -> dict:
    """OpenAI's json_schema response_format for a pydantic class, TypedDict, JSON schema or
    OpenAI function dict (as langchain-openai builds it)."""
    if isinstance(schema, dict) and schema.get("type") == "json_schema" and "json_schema" in schema:
        return schema
    if isinstance(schema, dict) and "name" in schema and "schema" in schema:
        return {"type": "json_schema", "json_schema": schema}
    function = convert_to_openai_function(schema, strict=bool(strict))
    function["schema"] = function.pop("parameters")
    return {"type": "json_schema", "json_schema": function}


def structured_output(model, schema: Any = None, *, method: str = "json_schema",
                      include_raw: bool = False, strict: bool | None = None,
                      **kwargs: Any) -> Runnable:
    """The runnable `ChatAsymSpec.with_structured_output` returns (see the module docstring)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if strict is not None and method == "json_mode":
        raise ValueError("Argument `strict` is not supported with `method`='json_mode'")
    if schema is None and method != "json_mode":
        raise ValueError(f"schema must be specified when method is {method!r}")
    pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
    if method == "json_schema" and pydantic and issubclass(schema, BaseModelV1):
        method = "function_calling"
    ls_format = {"kwargs": {"method": method, "strict": strict}, "schema": schema}
    if method == "function_calling":
        name = convert_to_openai_tool(schema)["function"]["name"]
        llm = model.bind_tools([schema], tool_choice=name, ls_structured_output_format=ls_format,
                               **kwargs)
        parser = PydanticToolsParser(tools=[schema], first_tool_only=True) if pydantic else \
            JsonOutputKeyToolsParser(key_name=name, first_tool_only=True)
    else:
        response_format = {"type": "json_object"} if method == "json_mode" else \
            response_format_for(schema, strict)
        if method == "json_mode":
            ls_format = {"kwargs": {"method": method}, "schema": schema}
        llm = model.bind(response_format=response_format, ls_structured_output_format=ls_format,
                         **kwargs)
        parser = PydanticOutputParser(pydantic_object=schema) if pydantic else JsonOutputParser()
    if not include_raw:
        return llm | parser
    parsed = RunnablePassthrough.assign(parsed=itemgetter("raw") | parser,
                                        parsing_error=lambda _: None)
    fallback = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=llm) | parsed.with_fallbacks([fallback], exception_key="parsing_error")
