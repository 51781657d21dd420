"""Message selectors (the JMS / AMQP `apache.org:selector-filter:string` filter) compiled to a
PostgreSQL jsonpath predicate over a message's stored headers. Pure: no I/O.

A consumer with a selector gets only the messages it selects; in a classic queue the others stay
for the group's other consumers (fluxpg.claim with a selector, sql/functions.sql). The selector
is evaluated in PostgreSQL only — `coalesce(headers, '{}') @@ <jsonpath>` — so there is one
evaluator and no Python mirror of it. The jsonpath goes to PostgreSQL as a bound parameter of
type jsonpath: selector text never becomes SQL.

The language is the SQL-92 subset JMS defines: identifiers (a message's properties: the
application properties of AMQP 1.0, the headers of AMQP 0-9-1 and the user properties of MQTT 5,
all stored at the top level of headers), string / numeric / boolean literals, = <> < <= > >=,
+ - * /, AND OR NOT, [NOT] BETWEEN, [NOT] IN, [NOT] LIKE with ESCAPE, IS [NOT] NULL, parentheses.
Keywords are case-insensitive. JMSCorrelationID, JMSMessageID, JMSType and JMSPriority read the
AMQP 1.0 message's own fields. Three-valued logic as JMS: a comparison with a missing property is
unknown, and an unknown selector does not select (jsonpath's unknown is the same thing).
"""
from __future__ import annotations

import json
import re

from fluxpg.errors import InvalidArgument

MAX_SELECTOR_LENGTH = 4096   # a selector is a short predicate; this bounds parsing work
MAX_DEPTH = 64               # nesting of parentheses and NOT

# JMS header fields → where an AMQP 1.0 message keeps them in the stored headers (messages.py).
_JMS_FIELDS = {
    "JMSCorrelationID": '$."x-amqp"."properties"."correlation-id"',
    "JMSMessageID": '$."x-amqp"."properties"."message-id"',
    "JMSType": '$."x-amqp"."properties"."subject"',
    "JMSPriority": '$."x-amqp"."header"."priority"',
}

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>'(?:[^']|'')*')
  | (?P<number>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[lLfFdD]?)
  | (?P<ident>(?:[^\W\d]|\$)[\w$]*)
  | (?P<op><>|<=|>=|=|<|>|\(|\)|,|\+|-|\*|/)
""", re.X)

_KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"}
_COMPARISONS = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class SelectorError(InvalidArgument):
    """A selector that is not valid: the message says where and why."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SelectorError(f"selector: unexpected {text[pos]!r} at position {pos + 1}")
        pos = m.end()
        kind = m.lastgroup
        value = m.group()
        if kind == "ws":
            continue
        if kind == "ident" and value.upper() in _KEYWORDS:
            kind, value = "kw", value.upper()
        out.append((kind, value))
    out.append(("end", ""))
    return out


def _quote(s: str) -> str:
    """A jsonpath string literal (jsonpath strings follow JSON's escapes)."""
    return json.dumps(s, ensure_ascii=False)


def _like_regex(pattern: str, escape: str | None) -> str:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape:
            if i + 1 >= len(pattern):
                raise SelectorError("selector: LIKE pattern ends with its escape character")
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        out.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return "^" + "".join(out) + "$"


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0
        self.depth = 0

    # --- token helpers ---
    def peek(self, offset: int = 0) -> tuple[str, str]:
        return self.toks[min(self.i + offset, len(self.toks) - 1)]

    def take(self) -> tuple[str, str]:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def accept(self, kind: str, value: str | None = None) -> bool:
        k, v = self.peek()
        if k == kind and (value is None or v == value):
            self.i += 1
            return True
        return False

    def expect(self, kind: str, value: str | None = None, what: str = "") -> str:
        k, v = self.peek()
        if k != kind or (value is not None and v != value):
            found = "the end" if k == "end" else repr(v)
            raise SelectorError(f"selector: expected {what or value or kind}, found {found}")
        self.i += 1
        return v

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SelectorError(f"selector: nested deeper than {MAX_DEPTH}")

    # --- grammar ---------------------------------------------------------------------------
    # JMS logic has three values and jsonpath's comparisons two (a comparison with a missing
    # property is false, so NOT of it would be true). A condition is therefore compiled to a pair
    # (when true, when false): NOT swaps them, AND / OR combine them by De Morgan, and a
    # comparison is false only when every property it reads is present. What is neither is
    # unknown, and a message is selected only when its selector is true.
    # A value is (jsonpath expression, the condition that all properties it reads are present,
    # or None when it reads none).

    def parse(self) -> str:
        cond = self.or_()
        if self.peek()[0] != "end":
            raise SelectorError(f"selector: unexpected {self.peek()[1]!r}")
        return cond[0]

    def or_(self) -> tuple[str, str]:
        t, f = self.and_()
        while self.accept("kw", "OR"):
            t2, f2 = self.and_()
            t, f = f"({t} || {t2})", f"({f} && {f2})"
        return t, f

    def and_(self) -> tuple[str, str]:
        t, f = self.not_()
        while self.accept("kw", "AND"):
            t2, f2 = self.not_()
            t, f = f"({t} && {t2})", f"({f} || {f2})"
        return t, f

    def not_(self) -> tuple[str, str]:
        if self.accept("kw", "NOT"):
            self.nest()
            t, f = self.not_()
            self.depth -= 1
            return f, t
        return self.predicate()

    @staticmethod
    def _both(*guards: str | None) -> str | None:
        present = [g for g in guards if g is not None]
        return " && ".join(present) if present else None

    @staticmethod
    def _compared(test: str, guard: str | None) -> tuple[str, str]:
        # jsonpath says unknown when the types differ ('x' = 1); JMS says false.
        false = f"(!{test} || {test} is unknown)"
        return test, (f"({guard} && {false})" if guard else false)

    def predicate(self) -> tuple[str, str]:
        if self.peek() == ("op", "(") and self._parenthesised_condition():
            self.take()
            self.nest()
            cond = self.or_()
            self.depth -= 1
            self.expect("op", ")", ")")
            return cond
        left, lguard = self.additive()
        k, v = self.peek()
        if k == "op" and v in _COMPARISONS:
            self.take()
            right, rguard = self.additive()
            return self._compared(f"({left} {_COMPARISONS[v]} {right})", self._both(lguard, rguard))
        negate = False
        if k == "kw" and v == "NOT" and self.peek(1)[1] in ("BETWEEN", "IN", "LIKE"):
            self.take()
            negate = True
            k, v = self.peek()
        if k == "kw" and v == "BETWEEN":
            self.take()
            lo, loguard = self.additive()
            self.expect("kw", "AND", "AND of BETWEEN")
            hi, higuard = self.additive()
            cond = self._compared(f"({left} >= {lo} && {left} <= {hi})", self._both(lguard, loguard, higuard))
        elif k == "kw" and v == "IN":
            self.take()
            self.expect("op", "(", "( after IN")
            items = [self.literal(strings_only=True)]
            while self.accept("op", ","):
                items.append(self.literal(strings_only=True))
            self.expect("op", ")", ") closing IN")
            cond = self._compared("(" + " || ".join(f"{left} == {item}" for item in items) + ")", lguard)
        elif k == "kw" and v == "LIKE":
            self.take()
            pattern = self._string(self.expect("string", what="a string pattern after LIKE"))
            escape = None
            if self.accept("kw", "ESCAPE"):
                escape = self._string(self.expect("string", what="an escape character"))
                if len(escape) != 1:
                    raise SelectorError("selector: ESCAPE takes exactly one character")
            cond = self._compared(f'({left} like_regex {_quote(_like_regex(pattern, escape))} flag "s")', lguard)
        elif k == "kw" and v == "IS":
            if negate:
                raise SelectorError("selector: NOT IS; write IS NOT NULL")
            self.take()
            is_not = self.accept("kw", "NOT")
            self.expect("kw", "NULL", "NULL after IS")
            present = f"({lguard})" if lguard else "(1 == 1)"
            absent = f"!{present}"
            return (present, absent) if is_not else (absent, present)
        else:
            if negate:
                raise SelectorError("selector: NOT must be followed by BETWEEN, IN or LIKE here")
            # A boolean property or literal used as a condition: `flag` means flag = TRUE.
            return self._compared(f"({left} == true)", lguard)
        return (cond[1], cond[0]) if negate else cond

    def _parenthesised_condition(self) -> bool:
        """At '(': does it open a condition (AND/OR/NOT/comparison inside) rather than a value
        such as (a + 1)? Decided by scanning to the matching ')'."""
        depth = 0
        for k, v in self.toks[self.i:]:
            if k == "op" and v == "(":
                depth += 1
            elif k == "op" and v == ")":
                depth -= 1
                if depth == 0:
                    return False
            elif depth >= 1 and (k == "kw" and v in ("AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "IS")
                                 or k == "op" and v in _COMPARISONS):
                return True
            elif k == "end":
                return False
        return False

    def additive(self) -> tuple[str, str | None]:
        left, guard = self.multiplicative()
        while self.peek() in (("op", "+"), ("op", "-")):
            op = self.take()[1]
            right, rguard = self.multiplicative()
            left, guard = f"({left} {op} {right})", self._both(guard, rguard)
        return left, guard

    def multiplicative(self) -> tuple[str, str | None]:
        left, guard = self.unary()
        while self.peek() in (("op", "*"), ("op", "/")):
            op = self.take()[1]
            right, rguard = self.unary()
            left, guard = f"({left} {op} {right})", self._both(guard, rguard)
        return left, guard

    def unary(self) -> tuple[str, str | None]:
        if self.peek() in (("op", "-"), ("op", "+")):
            op = self.take()[1]
            self.nest()
            inner, guard = self.unary()
            self.depth -= 1
            return (f"(-{inner})" if op == "-" else inner), guard
        return self.primary()

    def primary(self) -> tuple[str, str | None]:
        k, v = self.peek()
        if k == "op" and v == "(":
            self.take()
            self.nest()
            inner, guard = self.additive()
            self.depth -= 1
            self.expect("op", ")", ")")
            return f"({inner})", guard
        if k == "ident":
            self.take()
            if v.startswith("JMS"):
                if v not in _JMS_FIELDS:
                    raise SelectorError(f"selector: {v} is not supported (supported JMS fields: "
                                        f"{', '.join(sorted(_JMS_FIELDS))})")
                path = _JMS_FIELDS[v]
            else:
                path = f"$.{_quote(v)}"
            return path, f"exists({path} ? (@ != null))"
        if k == "kw" and v in ("TRUE", "FALSE"):
            self.take()
            return v.lower(), None
        return self.literal(), None

    def literal(self, strings_only: bool = False) -> str:
        k, v = self.peek()
        if k == "string":
            self.take()
            return _quote(self._string(v))
        if k == "number" and not strings_only:
            self.take()
            return self._number(v)
        found = "the end" if k == "end" else repr(v)
        raise SelectorError(f"selector: expected {'a string' if strings_only else 'a value'}, found {found}")

    @staticmethod
    def _string(token: str) -> str:
        return token[1:-1].replace("''", "'")

    @staticmethod
    def _number(token: str) -> str:
        text = token.rstrip("lLfFdD")
        try:
            value = float(text) if any(c in text for c in ".eE") else int(text)
        except ValueError:
            raise SelectorError(f"selector: bad number {token!r}") from None
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise SelectorError(f"selector: number out of range {token!r}")
            return repr(value)
        return str(value)


def selector_jsonpath(selector: str) -> str:
    """The jsonpath predicate of a JMS selector; SelectorError says what is wrong with it."""
    if not isinstance(selector, str):
        raise SelectorError(f"selector: expected a string, got {type(selector).__name__}")
    if len(selector) > MAX_SELECTOR_LENGTH:
        raise SelectorError(f"selector: longer than {MAX_SELECTOR_LENGTH} characters")
    if not selector.strip():
        raise SelectorError("selector: empty")
    return _Parser(selector).parse()
