"""llama.cpp's GBNF grammars, parsed and translated into the Lark grammar llguidance compiles.

GBNF (llama.cpp's ``grammars/README.md``) is a character-level context-free grammar: rules
``name ::= alternatives``, sequences, ``|``, ``( )`` grouping, ``*`` ``+`` ``?`` and ``{m}`` ``{m,}``
``{m,n}`` repetition, string literals with escapes (``\\n \\r \\t \\\\ \\" \\[ \\] \\xHH \\uHHHH
\\UHHHHHHHH``), character classes with ranges and ``^`` negation, ``.`` (any character) and ``#``
comments. A rule's alternatives go on over newlines only after ``|`` or inside parentheses, as in
llama.cpp. Generation starts at ``root``.

The translation stays at llama.cpp's character level: every literal character and every class is a
one-character lexeme of its own. llguidance's lexer is greedy, so a literal or class kept as one longer
lexeme (``[a-z]+`` as one regex) could swallow characters the rest of the grammar needed; single
characters cannot. Token references (``<[id]>``, ``<think>``) are refused: they name tokens of
llama.cpp's vocabulary, not text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A rule definition at the start of a line: what tells GBNF from Lark (whose rules are "name:").
_RULE_START = re.compile(r"^[ \t]*[A-Za-z0-9_-]+[ \t]*::=", re.MULTILINE)
_DEFINES = re.compile(r"[ \t]*::=")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
MAX_NESTING = 64  # parentheses within parentheses: a bound on the parser's recursion
MAX_REPEAT = 10_000  # the largest m or n of {m,n}
ROOT = "root"


class GbnfError(ValueError):
    """A GBNF grammar that cannot be parsed: one line naming where and what."""


def is_gbnf(text: str) -> bool:
    """Whether ``text`` is a GBNF grammar: it defines a rule with ``::=`` (Lark writes ``name:``)."""
    return _RULE_START.search(text) is not None


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class CharClass:
    ranges: tuple[tuple[str, str], ...]
    negated: bool


@dataclass(frozen=True)
class AnyChar:
    pass


@dataclass(frozen=True)
class RuleRef:
    name: str
    position: int


@dataclass(frozen=True)
class Repeat:
    item: Node
    low: int
    high: int | None  # None: unbounded


@dataclass(frozen=True)
class Choice:
    alternatives: tuple[tuple[Node, ...], ...]  # each alternative a sequence


Node = Literal | CharClass | AnyChar | RuleRef | Repeat | Choice


def _is_word(char: str) -> bool:
    return len(char) == 1 and char.isascii() and (char.isalnum() or char in "-_")


class _Parser:
    """llama.cpp's recursive-descent GBNF parser (``grammar-parser.cpp``), rule for rule."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.rules: dict[str, Choice] = {}
        self.references: list[RuleRef] = []

    def fail(self, message: str, position: int | None = None) -> GbnfError:
        at = self.pos if position is None else position
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return GbnfError(f"GBNF line {line}, column {column}: {message}")

    def peek(self, offset: int = 0) -> str:
        at = self.pos + offset
        return self.text[at] if at < len(self.text) else ""

    def skip_space(self, newlines: bool) -> None:
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "#":
                while self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
                    self.pos += 1
            elif char in " \t" or (newlines and char in "\r\n"):
                self.pos += 1
            else:
                return

    def parse(self) -> dict[str, Choice]:
        self.skip_space(newlines=True)
        while self.pos < len(self.text):
            self.parse_rule()
        if ROOT not in self.rules:
            raise GbnfError("GBNF grammar has no 'root' rule (generation starts at root ::= ...)")
        for reference in self.references:
            if reference.name not in self.rules:
                raise self.fail(f"rule {reference.name!r} is used but never defined", reference.position)
        return self.rules

    def parse_name(self) -> str:
        start = self.pos
        while _is_word(self.peek()):
            self.pos += 1
        if self.pos == start:
            raise self.fail(
                f"expecting a rule name, got {self.peek()!r}" if self.peek() else "unexpected end"
            )
        return self.text[start : self.pos]

    def parse_rule(self) -> None:
        start = self.pos
        name = self.parse_name()
        self.skip_space(newlines=False)
        if not self.text.startswith("::=", self.pos):
            raise self.fail(f"expecting '::=' after the rule name {name!r}")
        if name in self.rules:
            raise self.fail(f"rule {name!r} is defined twice", start)
        self.pos += 3
        self.skip_space(newlines=True)
        self.rules[name] = self.parse_alternatives(depth=0)
        if self.peek() in ("\r", "\n"):
            self.pos += 1
        elif self.pos < len(self.text):
            raise self.fail(f"unexpected {self.peek()!r} (expecting the end of rule {name!r})")
        self.skip_space(newlines=True)

    def parse_alternatives(self, depth: int) -> Choice:
        alternatives = [self.parse_sequence(depth)]
        while self.peek() == "|":
            self.pos += 1
            self.skip_space(newlines=True)
            alternatives.append(self.parse_sequence(depth))
        return Choice(tuple(alternatives))

    def parse_sequence(self, depth: int) -> tuple[Node, ...]:
        nested = depth > 0
        items: list[Node] = []
        while self.pos < len(self.text):
            char = self.peek()
            if char in "*+?{":
                if not items:
                    raise self.fail(f"{char!r} repeats nothing (expecting an item before it)")
                items[-1] = self.parse_repeat(items[-1])
            else:
                item = self.parse_item(depth)
                if item is None:
                    break
                items.append(item)
            self.skip_space(newlines=nested)
        return tuple(items)

    def parse_item(self, depth: int) -> Node | None:
        char = self.peek()
        if char == '"':
            return self.parse_literal()
        if char == "[":
            return self.parse_class()
        if char == ".":
            self.pos += 1
            return AnyChar()
        if char == "(":
            if depth >= MAX_NESTING:
                raise self.fail(f"parentheses nested more than {MAX_NESTING} deep")
            self.pos += 1
            self.skip_space(newlines=True)
            choice = self.parse_alternatives(depth + 1)
            if self.peek() != ")":
                raise self.fail("expecting ')'" if self.peek() else "unclosed '(' at the end")
            self.pos += 1
            return choice
        if char == "<" or (char == "!" and self.peek(1) == "<"):
            raise self.fail("token references (<...>) are not supported: write the text instead")
        if _is_word(char):
            start = self.pos
            name = self.parse_name()
            if _DEFINES.match(self.text, self.pos):
                raise self.fail(f"rule {name!r} starts on the line of the rule before it", start)
            reference = RuleRef(name, start)
            self.references.append(reference)
            return reference
        return None

    def parse_char(self) -> str:
        """One character of a literal or class, its escape decoded."""
        char = self.peek()
        if char != "\\":
            self.pos += 1
            return char
        code = self.peek(1)
        if code in _ESCAPES:
            self.pos += 2
            return _ESCAPES[code]
        if code in _HEX_ESCAPES:
            digits = self.text[self.pos + 2 : self.pos + 2 + _HEX_ESCAPES[code]]
            if len(digits) != _HEX_ESCAPES[code] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{code} needs {_HEX_ESCAPES[code]} hex digits")
            value = int(digits, 16)
            if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
                raise self.fail(f"\\{code}{digits} is not a Unicode character")
            self.pos += 2 + len(digits)
            return chr(value)
        raise self.fail(f"unknown escape '\\{code}'" if code else "unfinished escape at the end")

    def parse_literal(self) -> Literal:
        start = self.pos
        self.pos += 1
        chars = []
        while self.peek() != '"':
            if self.pos >= len(self.text) or self.peek() in "\r\n":
                raise self.fail("unclosed string literal", start)
            chars.append(self.parse_char())
        self.pos += 1
        return Literal("".join(chars))

    def parse_class(self) -> CharClass:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self.peek() != "]":
            if self.pos >= len(self.text):
                raise self.fail("unclosed character class", start)
            low = self.parse_char()
            high = low
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                high = self.parse_char()
                if high < low:
                    raise self.fail(f"character range {low!r}-{high!r} runs backwards")
            ranges.append((low, high))
        self.pos += 1
        if not ranges and not negated:
            raise self.fail("empty character class [] matches nothing", start)
        return CharClass(tuple(ranges), negated)

    def parse_count(self) -> int:
        start = self.pos
        while self.peek().isdigit() and self.peek().isascii():
            self.pos += 1
        if self.pos == start:
            raise self.fail("expecting a number in {m,n}")
        count = int(self.text[start : self.pos])
        if count > MAX_REPEAT:
            raise self.fail(f"repetition count {count} is above {MAX_REPEAT}", start)
        self.skip_space(newlines=True)
        return count

    def parse_repeat(self, item: Node) -> Repeat:
        char = self.peek()
        self.pos += 1
        if char != "{":
            return Repeat(item, 1 if char == "+" else 0, 1 if char == "?" else None)
        self.skip_space(newlines=True)
        low = self.parse_count()
        high: int | None = low
        if self.peek() == ",":
            self.pos += 1
            self.skip_space(newlines=True)
            high = self.parse_count() if self.peek().isdigit() else None
        if self.peek() != "}":
            raise self.fail("expecting '}' to close {m,n}")
        self.pos += 1
        if high is not None and high < low:
            raise self.fail(f"repetition {{{low},{high}}} has its maximum below its minimum")
        return Repeat(item, low, high)


def parse_gbnf(text: str) -> dict[str, Choice]:
    """The rules of a GBNF grammar by name; GbnfError (a ValueError) with one line saying what is wrong."""
    return _Parser(text).parse()


def _char_lexeme(char: str) -> str:
    if char.isascii() and char.isprintable() and char not in '"\\':
        return f'"{char}"'
    return f"/\\x{{{ord(char):x}}}/"


def _class_char(char: str) -> str:
    return char if char.isascii() and char.isalnum() else f"\\x{{{ord(char):x}}}"


class _LarkWriter:
    def __init__(self, rules: dict[str, Choice]) -> None:
        # GBNF names may hold '-' and capitals, which Lark's rule names cannot: numbered names instead.
        self.names = {name: f"gbnf_{index}" for index, name in enumerate(rules)}

    def sequence(self, items: tuple[Node, ...]) -> str:
        return " ".join(self.node(item) for item in items) if items else '""'

    def node(self, node: Node) -> str:
        if isinstance(node, Literal):
            return " ".join(_char_lexeme(c) for c in node.text) if node.text else '""'
        if isinstance(node, CharClass):
            if node.negated and not node.ranges:
                return "/(?s:.)/"
            body = "".join(
                _class_char(low) if low == high else f"{_class_char(low)}-{_class_char(high)}"
                for low, high in node.ranges
            )
            return f"/[{'^' if node.negated else ''}{body}]/"
        if isinstance(node, AnyChar):
            return "/(?s:.)/"
        if isinstance(node, RuleRef):
            return self.names[node.name]
        if isinstance(node, Repeat):
            item = f"({self.node(node.item)})"
            if (node.low, node.high) == (0, None):
                return f"{item}*"
            if (node.low, node.high) == (1, None):
                return f"{item}+"
            if (node.low, node.high) == (0, 1):
                return f"{item}?"
            return f"{item}{{{node.low},{'' if node.high is None else node.high}}}"
        return "(" + " | ".join(self.sequence(items) for items in node.alternatives) + ")"

    def rule(self, name: str, choice: Choice) -> str:
        return f"{self.names[name]}: " + "\n    | ".join(
            self.sequence(items) for items in choice.alternatives
        )


def gbnf_to_lark(text: str) -> str:
    """The Lark grammar (llguidance's dialect) generating exactly what the GBNF grammar does."""
    rules = parse_gbnf(text)
    writer = _LarkWriter(rules)
    lines = [f"start: {writer.names[ROOT]}"]
    lines.extend(writer.rule(name, choice) for name, choice in rules.items())
    return "\n".join(lines) + "\n"
