"""The demo agent's calculator (integrations/calculator_tool.py): exact decimal arithmetic, and everything else refused with a reason."""

from __future__ import annotations

import decimal
import time

import pytest

from asymagent.integrations.calculator_tool import (CALCULATOR_TOOL_NAME, MAX_DEPTH, MAX_EXPONENT,
                                                    CalculatorError, calculate, calculator_tool,
                                                    evaluate)


@pytest.mark.parametrize("expression, value", [
    ("2498.30 + 4021.15 + 1234.56 + 5942.91", "13696.92"),  # money: exact, cents kept
    ("0.1 + 0.2", "0.3"),  # decimal, not binary floating point (0.30000000000000004)
    ("1.10 * 2", "2.20"),
    ("10 / 4", "2.5"),
    ("(1200.50 + 349.99) * 2 - 80", "3020.98"),
    ("-(3) * 2", "-6"),
    ("+5 - -5", "10"),
    ("1e3 + 1", "1001"),
    ("1_000 + 1", "1001"),
    ("  7  ", "7"),
    ("-0.00 * 1", "0.00"),  # no signed zero
    ("100 - 99.99", "0.01"),
])
def test_valid_expressions_give_exact_values(expression, value):
    assert calculate(expression) == value


def test_money_sums_are_exact_where_floats_are_not():
    amounts = ["0.10"] * 10 + ["1234.56", "999.99", "0.07"]
    assert sum(float(a) for a in amounts) != 2235.62  # the float sum is off
    assert calculate(" + ".join(amounts)) == "2235.62"
    assert evaluate(" + ".join(amounts)) == decimal.Decimal("2235.62")


def test_division_is_rounded_to_the_precision():
    assert calculate("1 / 3") == "0." + "3" * 34
    assert calculate("2 / 3").endswith("67")


@pytest.mark.parametrize("expression, says", [
    ("__import__('os').system('true')", "function call"),
    ("abs(-1)", "function call"),
    ("x + 1", "the name 'x'"),
    ("13696.92 EUR", "not an arithmetic expression"),
    ("pi * 2", "the name 'pi'"),
    ("(1).real", "attribute"),
    ("().__class__", "attribute"),
    ("2 ** 1000000", "** (powers)"),
    ("9 ** 9 ** 9", "** (powers)"),
    ("7 % 2", "% (remainder)"),
    ("7 // 2", "// (floor division)"),
    ("1 << 100000", "<<"),
    ("~1", "~"),
    ("'a' * 3", "not a number"),
    ("True + 1", "not a number"),
    ("1j * 2", "not a number"),
    ("[1, 2]", "List"),
    ("1 if 1 else 2", "IfExp"),
    ("lambda: 1", "Lambda"),
    ("1,234.50 + 1", "comma"),
    ("1 == 1", "Compare"),
    ("", "empty"),
    ("1 +", "not an arithmetic expression"),
    ("x = 1", "not an arithmetic expression"),
])
def test_anything_but_arithmetic_is_refused_with_a_reason(expression, says):
    out = calculate(expression)
    assert out.startswith(f"ERROR: {CALCULATOR_TOOL_NAME}: ") and says in out, out
    assert "allowed" in out or says in ("empty",)
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_nothing_is_executed():
    import builtins

    seen = []
    original = builtins.__import__

    def spy(name, *a, **k):
        seen.append(name)
        return original(name, *a, **k)

    builtins.__import__ = spy
    try:
        calculate("__import__('os')")
    finally:
        builtins.__import__ = original
    assert "os" not in seen


@pytest.mark.parametrize("expression, says", [
    ("1e400", f"larger than 1e{MAX_EXPONENT}"),
    ("1e60 * 1e60", f"larger than 1e{MAX_EXPONENT}"),
    ("9" * 35, "digits"),
    ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "nests deeper"),
    ("-" * 500 + "1", "nests deeper"),
    ("1+" * 1500 + "1", "longer than"),
    ("1 / 0", "division by zero"),
    ("1 / (2 - 2)", "division by zero"),
])
def test_huge_deep_or_undefined_values_are_refused_quickly(expression, says):
    t0 = time.perf_counter()
    out = calculate(expression)
    assert out.startswith("ERROR: calculate: ") and says in out, out
    assert time.perf_counter() - t0 < 1.0


def test_long_flat_sums_within_the_bounds_still_work():
    assert calculate(" + ".join(["1.01"] * 280)) == "282.80"  # a flat chain is not "nesting"
    assert calculate("-".join(["1"] * 900)) == "-898"
    assert calculate("(" * (MAX_DEPTH // 2) + "1" + ")" * (MAX_DEPTH // 2)) == "1"


def test_a_non_string_argument_is_refused():
    assert calculate(None).startswith("ERROR: calculate: the expression must be a string")
    assert calculate(12).startswith("ERROR: calculate: the expression must be a string")


def test_the_schema_asks_for_one_string_and_says_to_use_it_for_sums():
    fn = calculator_tool()["function"]
    assert fn["name"] == CALCULATOR_TOOL_NAME == "calculate"
    assert fn["parameters"]["required"] == ["expression"]
    assert fn["parameters"]["properties"]["expression"]["type"] == "string"
    assert fn["parameters"]["additionalProperties"] is False
    assert "sum" in fn["description"] and "never add numbers in your head" in fn["description"]


def test_the_calculator_names_no_suite():
    from pathlib import Path

    import asymagent.integrations.calculator_tool as mod

    text = Path(mod.__file__).read_text().lower()
    for word in ("invoice", "injection", "records", "vendor", "import asymagent.evals", "from asymagent.evals",
                 "eval(", "exec("):
        assert word not in text, word
