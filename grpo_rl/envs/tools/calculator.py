"""A safe arithmetic calculator: the built-in tool of tool-using episodes.

The model's expression is parsed with ``ast.parse(mode="eval")`` and the tree is walked by hand; nothing is
passed to ``eval``, ``exec`` or ``compile``. Accepted: int and float literals, unary ``+``/``-``, binary
``+ - * / // % **`` and parentheses (which leave no node in the tree). Everything else (names, attribute access,
calls, subscripts, strings, bools, complex numbers, lambdas, comprehensions, comparisons, bitwise operators) is
refused before anything is evaluated.

The sampled text is adversarial by construction (the policy is optimised against whatever the tool does), so
every resource an expression can claim is bounded (:class:`Limits`):

* its length, checked before parsing, and its AST depth and size, checked before evaluating, so neither the
  parser nor the (recursive) evaluator can run out of stack;
* integer results below ``10**max_digits``, with bit lengths estimated *before* a multiplication or a power is
  computed: ``9**9**9``, ``(10**100)**100`` or a chain of products never allocates a large int;
* exponents: ``|b| <= max_exponent``; float results must be finite, and a power with a negative base and a
  fractional exponent (a complex number) is refused;
* wall-clock time, checked at every node of the walk. Given the other bounds this is a second line of defence,
  not the main one: an operation's operands have at most ~3,300 bits (its result at most twice that, before it is
  refused), so each operation takes microseconds, and there are at most ``max_nodes`` of them. A check between
  operations therefore ends a slow call within one operation's time; no thread or signal is needed.

:func:`calculator` returns the result as text, or one line starting with ``error:`` that a small model can read;
:func:`evaluate` returns the number or raises :class:`CalculatorError` with a ``kind`` (one of :data:`KINDS`), so
an environment can count tool errors by kind.
"""

from __future__ import annotations

import ast
import math
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["KINDS", "CalculatorError", "Limits", "calculator", "evaluate", "format_number"]

# The values of CalculatorError.kind.
KINDS = ("syntax", "disallowed", "too_large", "zero_division", "domain", "timeout", "too_long", "too_deep")

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}
_UNARY = {ast.UAdd: "+", ast.USub: "-"}
_REFUSED_OPERATORS = {
    ast.BitXor: "^ (write ** for powers)",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.MatMult: "@",
    ast.Invert: "~",
    ast.Not: "not",
}
_REFUSED_NODES = {
    ast.Name: "a name",
    ast.Attribute: "attribute access",
    ast.Call: "a function call",
    ast.Subscript: "a subscript",
    ast.Lambda: "a lambda",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a comprehension",
    ast.Compare: "a comparison",
    ast.BoolOp: "and/or",
    ast.IfExp: "if/else",
    ast.NamedExpr: ":=",
    ast.JoinedStr: "a string",
    ast.Tuple: "a tuple (a comma)",
    ast.List: "a list",
    ast.Set: "a set",
    ast.Dict: "a dict",
    ast.Starred: "*",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Slice: "a slice",
}
_ALLOWED = "only numbers, + - * / // % ** and parentheses are allowed"


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate. ``str(error)`` is one short line for the model;
    ``kind`` is one of :data:`KINDS`."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Limits:
    """What one expression may use.

    Attributes:
        max_length: characters, after stripping surrounding whitespace.
        max_depth: nesting of operators (``-(-(1))`` is depth 3; ``1+2+3`` is depth 3, a sum being a chain of
            binary nodes). 64 admits any flat sum of up to 64 terms.
        max_nodes: numbers and operators together.
        max_exponent: largest ``|b|`` in ``a ** b``.
        max_digits: integer results must be below ``10 ** max_digits`` in magnitude.
        time_limit: seconds one evaluation may take.
    """

    max_length: int = 200
    max_depth: int = 64
    max_nodes: int = 256
    max_exponent: int = 100
    max_digits: int = 1000
    time_limit: float = 0.5


DEFAULT_LIMITS = Limits()


def _describe(node: ast.AST) -> str | None:
    """What is wrong with ``node``, or None if the calculator accepts it."""
    if isinstance(node, ast.Constant):
        v = node.value
        if type(v) in (int, float):
            return None
        if isinstance(v, bool):
            return "a boolean"
        if isinstance(v, complex):
            return "a complex number"
        if isinstance(v, (str, bytes)):
            return "a string"
        return repr(v)
    if isinstance(node, ast.BinOp):
        return None if type(node.op) in _BINARY else f"the operator {_REFUSED_OPERATORS.get(type(node.op), '?')}"
    if isinstance(node, ast.UnaryOp):
        return None if type(node.op) in _UNARY else f"the operator {_REFUSED_OPERATORS.get(type(node.op), '?')}"
    if isinstance(node, (ast.Expression, ast.operator, ast.unaryop, ast.expr_context)):
        return None
    if isinstance(node, ast.Name):
        return f"the name {node.id[:20]!r}"
    return _REFUSED_NODES.get(type(node), type(node).__name__)


def _check_tree(tree: ast.Expression, limits: Limits) -> None:
    """Refuse a tree with a node outside the grammar, too many nodes or too deep a nesting (iteratively: the tree
    may be deeper than the evaluator's recursion should go)."""
    nodes = 0
    for node in ast.walk(tree):
        problem = _describe(node)
        if problem is not None:
            raise CalculatorError(f"{_ALLOWED} (found {problem})", "disallowed")
        nodes += isinstance(node, ast.expr)
    if nodes > limits.max_nodes:
        raise CalculatorError(f"expression too long (max {limits.max_nodes} numbers and operators)", "too_long")
    stack = [(tree.body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_depth:
            raise CalculatorError(f"expression nested too deeply (max depth {limits.max_depth})", "too_deep")
        if isinstance(node, ast.BinOp):
            stack += [(node.left, depth + 1), (node.right, depth + 1)]
        elif isinstance(node, ast.UnaryOp):
            stack.append((node.operand, depth + 1))


class _Evaluator:
    def __init__(self, limits: Limits):
        self.limits = limits
        self.int_bound = 10**limits.max_digits  # results must be below this in magnitude
        self.max_bits = self.int_bound.bit_length()  # any int with more bits is beyond the bound
        self.deadline = time.perf_counter() + limits.time_limit

    def too_large(self) -> CalculatorError:
        return CalculatorError(f"result too large (max {self.limits.max_digits} digits)", "too_large")

    def checked(self, value: Any) -> int | float:
        if isinstance(value, complex):
            raise CalculatorError("result is not a real number", "domain")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise CalculatorError("result too large (not a finite number)", "too_large")
        elif abs(value) >= self.int_bound:
            raise self.too_large()
        return value

    def eval(self, node: ast.expr) -> int | float:
        if time.perf_counter() > self.deadline:
            raise CalculatorError(f"took too long (max {self.limits.time_limit:g} s)", "timeout")
        if isinstance(node, ast.Constant):
            return self.checked(node.value)
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand)
            return -value if isinstance(node.op, ast.USub) else +value
        left, right = self.eval(node.left), self.eval(node.right)
        op = type(node.op)
        try:
            if op is ast.Pow:
                return self.checked(self.power(left, right))
            if op is ast.Mult and isinstance(left, int) and isinstance(right, int):
                # The product has bits(a) + bits(b) or one fewer: refuse it before it is computed.
                if left.bit_length() + right.bit_length() - 1 > self.max_bits:
                    raise self.too_large()
                return self.checked(left * right)
            if op is ast.Add:
                return self.checked(left + right)
            if op is ast.Sub:
                return self.checked(left - right)
            if op is ast.Mult:
                return self.checked(left * right)
            if op is ast.Div:
                return self.checked(left / right)
            if op is ast.FloorDiv:
                return self.checked(left // right)
            return self.checked(left % right)
        except ZeroDivisionError:
            what = {ast.Pow: "0 cannot be raised to a negative power", ast.Mod: "modulo by zero"}
            raise CalculatorError(what.get(op, "division by zero"), "zero_division") from None
        except OverflowError:
            raise CalculatorError("result too large", "too_large") from None

    def power(self, base: int | float, exponent: int | float) -> int | float | complex:
        if abs(exponent) > self.limits.max_exponent:
            raise CalculatorError(f"exponent too large (max {self.limits.max_exponent})", "too_large")
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
            # base ** e has at least (bits(base) - 1) * e + 1 bits: refuse it before it is computed. Otherwise
            # it has at most bits(base) * e <= max_bits + max_exponent bits, cheap to compute and check.
            if (base.bit_length() - 1) * exponent + 1 > self.max_bits:
                raise self.too_large()
        # A negative int exponent makes Python compute in floats (an int base beyond a float raises
        # OverflowError); a negative base with a fractional exponent gives a complex number (refused by checked).
        return base**exponent


def evaluate(expression: str, limits: Limits = DEFAULT_LIMITS) -> int | float:
    """The value of an arithmetic expression.

    Args:
        expression: e.g. ``"2*(3+4)"``. A JSON number (the model wrote ``{"expression": 12}``) is accepted as its
            text; any other non-string is a syntax error. Line breaks and tabs count as spaces.
        limits: the bounds (see :class:`Limits`).

    Raises:
        CalculatorError: with ``kind`` one of :data:`KINDS`; nothing else escapes.
    """
    if isinstance(expression, (int, float)) and not isinstance(expression, bool):
        expression = repr(expression)
    if not isinstance(expression, str):
        raise CalculatorError(
            f'the expression must be a string, e.g. "2*(3+4)" (got {type(expression).__name__})', "syntax"
        )
    text = expression.strip().replace("\r", " ").replace("\n", " ").replace("\t", " ")
    if len(text) > limits.max_length:
        raise CalculatorError(f"expression too long ({len(text)} characters, max {limits.max_length})", "too_long")
    if not text:
        raise CalculatorError("empty expression", "syntax")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError) as e:  # ValueError: a null byte
        detail = (getattr(e, "msg", None) or str(e) or "invalid syntax").splitlines()[0][:80]
        raise CalculatorError(
            "invalid syntax" + ("" if detail == "invalid syntax" else f": {detail}"), "syntax"
        ) from None
    except (RecursionError, MemoryError):  # a parser out of stack: only reachable with a raised max_length
        raise CalculatorError("expression nested too deeply", "too_deep") from None
    _check_tree(tree, limits)
    return _Evaluator(limits).eval(tree.body)


def format_number(value: int | float) -> str:
    """Integers in plain digits; floats to 12 significant digits, without ``.0`` when integral and exact.

    ``0.1 + 0.2`` -> ``0.3``, ``7 / 7`` -> ``1``, ``1 / 3`` -> ``0.333333333333``, ``2 ** -40`` ->
    ``9.09494701773e-13``, ``1e20`` -> ``1e+20`` (an integral float beyond 1e15 keeps the exponent form, as its
    trailing digits are not exact).
    """
    if isinstance(value, int):
        return str(value)
    rounded = float(f"{value:.12g}")
    if rounded.is_integer() and abs(rounded) < 1e15:
        return str(int(rounded))
    return repr(rounded)


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: the arithmetic expression, e.g. "2*(3+4)".
    """
    try:
        return format_number(evaluate(expression))
    except CalculatorError as e:
        return f"error: {e}"
