"""The demo agent's arithmetic tool: `calculate(expression)`, exact decimal arithmetic read with `ast`, never `eval`.

Agent stacks give their models a calculator (LangChain's math tools, smolagents' python tool,
OpenAI's code interpreter) because a small model sums badly: measured 2026-12-07 (docs/log.md),
the reference pair's 1.5B made every call of a task right and then wrote "15,000.00 EUR" for a
total of 13696.92. The tool is generic: it knows numbers and + - * / and parentheses, nothing of
any suite.

Safety: the expression is parsed with `ast.parse(mode="eval")` and walked node by node; only
numeric literals, unary + and -, binary + - * / and parentheses (which `ast` folds into the tree)
are evaluated. Names, calls, attributes, subscripts, strings, powers and every other node are
refused with an error text that says what was found and what is allowed, so the model can write
the call again. Length, nesting, digits and magnitude are bounded (MAX_* below). Numbers are
`decimal.Decimal` made from the literal's own text ("0.1" is 0.1, not the nearest float), so
sums of money are exact; division is rounded to PRECISION significant digits.
"""

from __future__ import annotations

import ast
import decimal
from dataclasses import dataclass

CALCULATOR_TOOL_NAME = "calculate"
MAX_EXPRESSION_CHARS = 2000  # longer input is refused before parsing
MAX_DEPTH = 60  # nested operators/parentheses; deeper is refused (and keeps ast's recursion bounded)
PRECISION = 34  # significant digits of every value (decimal128's), ample for money
MAX_NUMBER_DIGITS = PRECISION  # digits of one literal: every literal is exact
MAX_EXPONENT = 99  # values beyond 1e99 (or a literal like 1e400) are refused as an overflow
ALLOWED = "numbers, + - * / and parentheses"

# operator -> the decimal.Context method that computes it (rounded to the context's precision)
_BINARY = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply", ast.Div: "divide"}
_UNARY = {ast.UAdd: "plus", ast.USub: "minus"}
_REFUSED_OPERATORS = {ast.Pow: "** (powers)", ast.Mod: "% (remainder)", ast.FloorDiv: "// (floor division)",
                      ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
                      ast.LShift: "<<", ast.RShift: ">>", ast.Invert: "~", ast.Not: "not"}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is for the model."""


def calculator_tool() -> dict:
    """The OpenAI tool schema of `calculate(expression)`."""
    return {"type": "function", "function": {
        "name": CALCULATOR_TOOL_NAME,
        "description": ("Evaluate an arithmetic expression exactly and return its value. Use it for "
                        "EVERY sum, difference, product or quotient (for example a total of several "
                        "amounts): never add numbers in your head, call calculate and use its result. "
                        f"Allowed: {ALLOWED}, e.g. \"1200.50 + 349.99 + (80 * 2)\"; write numbers "
                        "without thousands separators or units."),
        "parameters": {"type": "object",
                       "properties": {"expression": {"type": "string",
                                                     "description": "the arithmetic expression"}},
                       "required": ["expression"], "additionalProperties": False}}}


@dataclass
class _Walk:
    """One evaluation: the source text (for the literals' own digits) and the decimal context."""

    source: str
    context: decimal.Context

    def value(self, node: ast.AST, depth: int = 0) -> decimal.Decimal:
        if depth > MAX_DEPTH:
            raise CalculatorError(f"the expression nests deeper than {MAX_DEPTH} levels")
        if isinstance(node, ast.Expression):
            return self.value(node.body, depth + 1)
        if isinstance(node, ast.Constant):
            return self.number(node)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return getattr(self.context, _UNARY[type(node.op)])(self.value(node.operand, depth + 1))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self.chain(node, depth)
        raise CalculatorError(_refusal(node, self.source))

    def chain(self, node: ast.BinOp, depth: int) -> decimal.Decimal:
        """A left-nested run of operators ("a + b + c + ...", as `ast` builds it) folded in a
        loop, so a long flat sum is not a deep recursion; only right operands nest."""
        spine = []
        while isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            spine.append(node)
            node = node.left
        value = self.value(node, depth + 1)
        for op_node in reversed(spine):
            right = self.value(op_node.right, depth + 1)
            if isinstance(op_node.op, ast.Div) and right == 0:
                raise CalculatorError("division by zero")
            value = getattr(self.context, _BINARY[type(op_node.op)])(value, right)
        return value

    def number(self, node: ast.Constant) -> decimal.Decimal:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"{_shown(node, self.source)} is not a number; allowed: {ALLOWED}")
        text = (ast.get_source_segment(self.source, node) or repr(node.value)).replace("_", "")
        if sum(c.isdigit() for c in text) > MAX_NUMBER_DIGITS:
            raise CalculatorError(f"a number has more than {MAX_NUMBER_DIGITS} digits")
        try:
            return self.context.create_decimal(text)  # the literal's digits, under the bounds
        except decimal.InvalidOperation:  # not decimal notation (e.g. a hex literal): its value
            return self.context.create_decimal(node.value if isinstance(node.value, int) else repr(node.value))


def _shown(node: ast.AST, source: str) -> str:
    text = ast.get_source_segment(source, node) or type(node).__name__
    return repr(text if len(text) <= 40 else text[:39] + "…")


def _refusal(node: ast.AST, source: str) -> str:
    """What was found, in words, and what is allowed."""
    op = getattr(node, "op", None)
    if op is not None and type(op) in _REFUSED_OPERATORS:
        what = f"the operator {_REFUSED_OPERATORS[type(op)]}"
    elif isinstance(node, ast.Name):
        what = f"the name {node.id!r} (no variables, units or constants)"
    elif isinstance(node, ast.Call):
        what = f"a function call {_shown(node, source)}"
    elif isinstance(node, ast.Attribute):
        what = f"an attribute {_shown(node, source)}"
    elif isinstance(node, ast.Tuple):
        what = f"a comma in {_shown(node, source)} (write 1234.5, not 1,234.5; one expression only)"
    else:
        what = f"{_shown(node, source)} ({type(node).__name__})"
    return f"{what} is not allowed; allowed: {ALLOWED}"


def evaluate(expression: str) -> decimal.Decimal:
    """The exact value of `expression` (module docstring); CalculatorError for anything refused."""
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise CalculatorError("the expression is empty")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    depth = 0
    for c in text:  # parentheses bounded before ast sees them (its parser recurses on them)
        depth += (c == "(") - (c == ")")
        if depth > MAX_DEPTH:
            raise CalculatorError(f"the expression nests deeper than {MAX_DEPTH} levels")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculatorError(f"not an arithmetic expression ({getattr(exc, 'msg', None) or exc}); "
                              f"allowed: {ALLOWED}") from None
    context = decimal.Context(prec=PRECISION, rounding=decimal.ROUND_HALF_EVEN, Emax=MAX_EXPONENT,
                              Emin=-MAX_EXPONENT, traps=[decimal.InvalidOperation, decimal.Overflow,
                                                    decimal.DivisionByZero])
    try:
        return _Walk(text, context).value(tree)
    except RecursionError:
        raise CalculatorError(f"the expression nests deeper than {MAX_DEPTH} levels") from None
    except decimal.Overflow:
        raise CalculatorError(f"a value is larger than 1e{MAX_EXPONENT}") from None
    except decimal.DecimalException as exc:
        raise CalculatorError(f"the value cannot be computed ({type(exc).__name__})") from None


def format_value(value: decimal.Decimal) -> str:
    """Plain notation, no exponent: Decimal("1E+3") -> "1000"; trailing zeros stay as computed
    ("1.10 * 2" -> "2.20"); a zero has no sign."""
    return format(value.copy_abs() if value.is_zero() else value, "f")  # "-0.00" -> "0.00"


def calculate(expression) -> str:
    """The tool's output: the value as text, or "ERROR: calculate: ..." (the model may try again)."""
    try:
        return format_value(evaluate(expression))
    except CalculatorError as exc:
        return f"ERROR: {CALCULATOR_TOOL_NAME}: {exc}"
