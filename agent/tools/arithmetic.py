"""The calculator tool: safe arithmetic, an allowlist walk over the parsed expression.

Nothing is ever compiled or evaluated as code (simpleeval and asteval have both had sandbox
escapes). Only number constants and + - * / // % ** and unary +/- are allowed; the input length,
the nesting depth, every operand's size and every exponent (checked before it is computed,
since in 9**9**9**9 the innermost power comes first) are bounded.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

from agent.tools.registry import ToolError


class CalculatorError(ValueError):
    """The expression was refused; the message says why, for the model to read."""


MAX_EXPRESSION_CHARS = 200  # bounded before parsing: ast.parse recurses and can raise RecursionError
MAX_DEPTH = 100  # tree depth; a sum of n terms is n deep, so 30 would refuse an ordinary 31-term sum
MAX_EXPONENT = 1000  # absolute value of any exponent (1.01**365 is fine)
MAX_RESULT_DIGITS = 300  # decimal digits of any intermediate result (also keeps floats finite)
_MAX_ABS = 10**MAX_RESULT_DIGITS

_BINARY_OPS: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY_OPS: dict[type, Callable] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_REFUSALS: dict[type, str] = {  # clearer words for the usual attempts; others are refused by node name
    ast.Name: "names", ast.Call: "function calls", ast.Attribute: "attribute access", ast.Subscript: "indexing",
    ast.Lambda: "lambdas", ast.NamedExpr: "assignments", ast.JoinedStr: "strings", ast.Compare: "comparisons",
}  # fmt: skip


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly: numbers, + - * / // % ** and parentheses.

    Args:
        expression: the expression, e.g. "17*23" or "(2.5 + 4) ** 2 / 3"
    """
    try:
        return evaluate(expression)
    except CalculatorError as exc:
        raise ToolError(str(exc)) from None


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression, as text; CalculatorError says why it was refused."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression is too long ({len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS})"
        )
    if not expression.strip():
        raise CalculatorError("expression is empty")
    if "\x00" in expression:
        raise CalculatorError("expression contains a null byte")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"not a valid arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body, 1)
    if isinstance(value, int):
        return str(value)
    value = value + 0.0  # turns -0.0 into 0.0
    return format(value, ".12g")


def _evaluate(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression is nested too deeply (more than {MAX_DEPTH} levels)")
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):  # bool, str, bytes, complex, None, Ellipsis
            raise CalculatorError(f"only numbers are allowed, not {type(node.value).__name__} ({node.value!r:.40})")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _bounded(_UNARY_OPS[type(node.op)](_evaluate(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left = _evaluate(node.left, depth + 1)
        right = _evaluate(node.right, depth + 1)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)  # before computing: 9**9**9**9 must never be attempted
        try:
            return _bounded(_BINARY_OPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        except OverflowError:
            raise CalculatorError("result is too large") from None
    op = getattr(node, "op", None)
    what = _REFUSALS.get(type(node)) or (f"the operator {type(op).__name__}" if op else type(node).__name__)
    detail = f" ({node.id!r})" if isinstance(node, ast.Name) else ""
    raise CalculatorError(f"not allowed: {what}{detail}; use numbers, + - * / // % ** and parentheses only")


def _check_power(base: int | float, exponent: int | float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent:.6g} is too large (the limit is {MAX_EXPONENT})")
    if base == 0 or abs(base) == 1:
        return
    if exponent * math.log10(abs(base)) > MAX_RESULT_DIGITS:
        raise CalculatorError(f"result would have more than {MAX_RESULT_DIGITS} digits")


def _bounded(value: object) -> int | float:
    if isinstance(value, complex):  # (-8) ** 0.5
        raise CalculatorError("the result is a complex number, which is not supported")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is too large")
    if abs(value) > (_MAX_ABS if isinstance(value, int) else float(_MAX_ABS)):  # the float 1e300 is a hair above
        raise CalculatorError(f"number is too large (more than {MAX_RESULT_DIGITS} digits)")
    return value
