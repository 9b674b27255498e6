"""Edits of xgrammar's EBNF text: bounded digits for JSON numbers, N call objects in one turn.

xgrammar prints a compiled-from-schema grammar as EBNF (`str(grammar)`) and parses it back
(`Grammar.from_ebnf`); the edits here work on that text, outside string literals (`"..."`,
`Regex("...")`) and character classes (`[...]`), so a `pattern` or a property name that happens
to read like a rule is never touched.

Numbers. xgrammar 0.2.9 writes a JSON number with unbounded digit runs (`[1-9] [0-9]*`,
`"." digits{1, -1}`, exponent `digits{1, -1}`), so a model that keeps writing digits
(`3.14159265358979323846264...`) never reaches the end of the value and runs to max_tokens.
`bound_number_digits` caps each run: at most `INTEGER_DIGITS` digits before the point (an
integer: |n| < 10**16, which also covers JavaScript's safe integers), `FRACTION_DIGITS` after
it, `EXPONENT_DIGITS` in an exponent. Numbers with both `minimum` and `maximum` are already
bounded by xgrammar (6 fraction digits) and keep its form.

Calls. `repeated_root(call_ebnf, n, ...)` renames a grammar's `root` rule and makes a new root
of 1..n copies joined by a separator (the form chat_format renders several calls in).
"""

from __future__ import annotations

import re

INTEGER_DIGITS = 16  # digits before the decimal point (integers and the integer part of numbers)
FRACTION_DIGITS = 16  # digits after the decimal point (float64 holds ~16 significant digits)
EXPONENT_DIGITS = 3  # digits of an exponent (float64 ends at 1e308)

_RULE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= (.*)$")
_DIGIT_CLASS = "[0-9]"
_UNBOUNDED_USE = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)\{(\d+), -1\}")
_EXPONENT_RULE = "basic_number_5"  # xgrammar's `[eE] sign digits{1, -1}`
_FRACTION_RULE = "basic_number_3"  # xgrammar's `"." digits{1, -1}`


def split_literals(body: str) -> list[tuple[str, str]]:
    """[(kind, text)] pieces of one rule body: kind "code", "string" (a `"..."` literal) or
    "class" (a `[...]` character class); escapes inside literals and classes are honoured."""
    pieces: list[tuple[str, str]] = []
    code_start = i = 0
    while i < len(body):
        ch = body[i]
        if ch in '"[':
            close = '"' if ch == '"' else "]"
            j = i + 1
            while j < len(body) and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            if code_start < i:
                pieces.append(("code", body[code_start:i]))
            pieces.append(("string" if ch == '"' else "class", body[i:j + 1]))
            i = code_start = j + 1
        else:
            i += 1
    if code_start < len(body):
        pieces.append(("code", body[code_start:]))
    return pieces


def _rules(ebnf: str) -> list[tuple[str | None, str]]:
    """[(rule name or None for a line that is not a rule, body or the whole line)]."""
    out = []
    for line in ebnf.splitlines():
        m = _RULE.match(line)
        out.append((m.group(1), m.group(2)) if m else (None, line))
    return out


def _join(rules: list[tuple[str | None, str]]) -> str:
    return "\n".join(line if name is None else f"{name} ::= {line}" for name, line in rules) + "\n"


def bound_number_digits(ebnf: str, integer_digits: int = INTEGER_DIGITS,
                        fraction_digits: int = FRACTION_DIGITS,
                        exponent_digits: int = EXPONENT_DIGITS) -> str:
    """The grammar text with every unbounded run of digits capped (see the module docstring).

    `[0-9]*` follows a leading `[1-9]` in xgrammar's integers, so it becomes
    `[0-9]{0, integer_digits - 1}`; a rule that is one digit class (`x ::= (([0-9]))`) used as
    `x{n, -1}` becomes `x{n, m}` with m the exponent, fraction or integer bound by where it is."""
    rules = _rules(ebnf)
    digit_rules = {name for name, body in rules if name and body == f"(({_DIGIT_CLASS}))"}
    rest = max(integer_digits - 1, 1)

    def cap(name: str, lo: int) -> str:
        return f"{name}{{{lo}, {max(lo, hi)}}}"

    out = []
    for name, body in rules:
        if name is None:
            out.append((name, body))
            continue
        hi = exponent_digits if name == _EXPONENT_RULE else \
            fraction_digits if name == _FRACTION_RULE else rest
        pieces = split_literals(body)
        text = []
        for k, (kind, piece) in enumerate(pieces):
            if kind == "class":
                nxt = pieces[k + 1] if k + 1 < len(pieces) else None
                if piece == _DIGIT_CLASS and nxt and nxt[0] == "code" and nxt[1].startswith("*"):
                    pieces[k + 1] = ("code", nxt[1][1:])
                    piece = f"{_DIGIT_CLASS}{{0, {rest}}}"
                text.append(piece)
            elif kind == "code":
                text.append(_UNBOUNDED_USE.sub(
                    lambda m: cap(m.group(1), int(m.group(2))) if m.group(1) in digit_rules
                    else m.group(0), pieces[k][1]))
            else:
                text.append(piece)
        out.append((name, "".join(text)))
    return _join(out)


def _rename_rule(body: str, old: str, new: str) -> str:
    ref = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(old)}(?![A-Za-z0-9_])")
    return "".join(ref.sub(new, piece) if kind == "code" else piece
                   for kind, piece in split_literals(body))


def ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def repeated_root(ebnf: str, max_count: int, *, separator: str = "\n", before: str = "",
                  after: str = "", item_rule: str = "asymagent_item") -> str:
    """A grammar of 1..max_count copies of `ebnf`'s root, each wrapped in `before`/`after`,
    joined by `separator` (the old root is renamed `item_rule`)."""
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count}")
    rules = [(None if name is None else (item_rule if name == "root" else name),
              body if name is None else _rename_rule(body, "root", item_rule))
             for name, body in _rules(ebnf)]
    item = " ".join(p for p in (ebnf_literal(before) if before else "", item_rule,
                                ebnf_literal(after) if after else "") if p)
    root = f"(({item}))" if max_count == 1 else \
        f"(({item} ({ebnf_literal(separator)} {item}){{0, {max_count - 1}}}))"
    return _join([("root", root)] + rules)
