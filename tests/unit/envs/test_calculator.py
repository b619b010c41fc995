"""Tests for the safe calculator (grpo_rl.envs.tools.calculator): exact values and their formatting, refused syntax,
and hostile expressions (huge powers and products, deep nesting, attribute access, names, calls), each ending
with the right error kind and without building a huge number."""

from __future__ import annotations

import pytest

from grpo_rl.envs.tools.calculator import (
    DEFAULT_LIMITS,
    KINDS,
    CalculatorError,
    Limits,
    calculator,
    evaluate,
    format_number,
)


def kind_of(expression, limits: Limits = DEFAULT_LIMITS) -> str:
    with pytest.raises(CalculatorError) as info:
        evaluate(expression, limits)
    assert info.value.kind in KINDS
    assert "\n" not in str(info.value)
    return info.value.kind


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    "expression, value",
    [
        ("2+3*4", 14),
        ("(2+3)*4", 20),
        ("7//2", 3),
        ("-7 % 3", 2),
        ("-7 // 2", -4),
        ("2**10", 1024),
        ("1/4", 0.25),
        ("123456789*987654321", 121932631112635269),
        ("-(-(1))", 1),
        ("+5", 5),
        ("2**-1", 0.5),
        ("(-2)**3", -8),
        ("(-2)**-3", -0.125),
        ("0**0", 1),
        ("2**0.5", 2**0.5),
        ("1_000 + 0x10", 1016),
        ("((((1))))", 1),
        ("10**99 * 10**99", 10**198),
        ("2**100", 2**100),
        ("7.5 % 2", 1.5),
        (" 1 +\n 2 ", 3),
        (12, 12),
        (2.5, 2.5),
    ],
)
def test_values_are_exact(expression, value):
    result = evaluate(expression)
    assert result == value and type(result) is type(value)


@pytest.mark.parametrize(
    "expression, text",
    [
        ("2+3*4", "14"),
        ("0.1+0.2", "0.3"),
        ("1/4", "0.25"),
        ("7/7", "1"),
        ("3.0*2", "6"),
        ("1/3", "0.333333333333"),
        ("2**-40", "9.09494701773e-13"),
        ("1e20", "1e+20"),
        ("-0.0", "0"),
        ("2**0.5", "1.41421356237"),
        ("123456789*987654321", "121932631112635269"),
        ("2**100", str(2**100)),
    ],
)
def test_calculator_formats_results(expression, text):
    assert calculator(expression) == text


def test_format_number_keeps_big_integers_whole():
    assert format_number(10**50) == "1" + "0" * 50
    assert format_number(1e15 + 0.0) == "1000000000000000.0"  # beyond 1e15 an integral float stays a float


def test_results_up_to_the_digit_cap_are_allowed():
    assert (
        evaluate("10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99") == 10**990
    )
    assert (
        kind_of("10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**99 * 10**10")
        == "too_large"
    )  # exactly 10**1000: 1001 digits


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("expression", ["2+", "2 +* 3", "(1", "1)", "12 * 7 = 84", "1 2", "1\x00"])
def test_syntax_errors(expression):
    assert kind_of(expression) == "syntax"
    assert calculator(expression).startswith("error: invalid syntax")


@pytest.mark.parametrize("expression", ["", "   ", "\n"])
def test_empty_expression(expression):
    assert kind_of(expression) == "syntax"
    assert calculator(expression) == "error: empty expression"


@pytest.mark.parametrize("value", [None, True, [1, 2], {"expression": "1"}])
def test_a_non_string_is_refused(value):
    assert kind_of(value) == "syntax"


@pytest.mark.parametrize(
    "expression, found",
    [
        ("abc", "the name 'abc'"),
        ("x", "the name 'x'"),
        ("__import__('os')", "a function call"),
        ("().__class__", "attribute access"),
        ("(1).__class__", "attribute access"),
        ("(1).__class__.__bases__[0].__subclasses__()", "a function call"),
        ("abs(-1)", "a function call"),
        ("[1][0]", "a subscript"),
        ("lambda: 1", "a lambda"),
        ("[i for i in (1, 2)]", "a comprehension"),
        ("(i for i in (1, 2))", "a comprehension"),
        ("'a'", "a string"),
        ("'a' * 10", "a string"),
        ("b'a'", "a string"),
        ("f'{1}'", "a string"),
        ("True", "a boolean"),
        ("None", "None"),
        ("1j", "a complex number"),
        ("2^10", "the operator ^ (write ** for powers)"),
        ("1 << 10000", "the operator <<"),
        ("~1", "the operator ~"),
        ("not 1", "the operator not"),
        ("1 < 2", "a comparison"),
        ("1 and 2", "and/or"),
        ("1 if 1 else 2", "if/else"),
        ("1, 2", "a tuple (a comma)"),
        ("{1: 2}", "a dict"),
        ("(x := 1)", ":="),
        ("...", "Ellipsis"),
    ],
)
def test_disallowed_nodes_are_named(expression, found):
    assert kind_of(expression) == "disallowed"
    assert calculator(expression).endswith(f"(found {found})")


def test_a_disallowed_node_is_refused_before_anything_is_evaluated():
    assert kind_of("9**9**9 + x") == "disallowed"


@pytest.mark.parametrize(
    "expression, message",
    [
        ("1/0", "division by zero"),
        ("1//0", "division by zero"),
        ("5 % 0", "modulo by zero"),
        ("1.0/0.0", "division by zero"),
        ("0**-1", "0 cannot be raised to a negative power"),
        ("0.0**-1.5", "0 cannot be raised to a negative power"),
    ],
)
def test_division_by_zero(expression, message):
    assert kind_of(expression) == "zero_division"
    assert calculator(expression) == f"error: {message}"


def test_a_complex_result_is_a_domain_error():
    assert kind_of("(-8)**(1/3)") == "domain"
    assert calculator("(-8)**0.5") == "error: result is not a real number"


# --------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize("expression", ["9**9**9", "10**1000", "2**-10000", "2**101", "2**100.5", "2**(10*11)"])
def test_huge_exponents_are_refused_before_computing(expression):
    assert kind_of(expression) == "too_large"
    assert calculator(expression) == "error: exponent too large (max 100)"


@pytest.mark.parametrize(
    "expression",
    [
        "(10**100)**100",
        "(10**99)**11",
        "(2**100)**34",
        "(10**99 * 10**99)**6",
        "*".join(["10**99"] * 11),  # a product chain growing one factor at a time past the cap
        "*".join(["(10**99*10**99*10**99)"] * 5),
        "9" * 150 + "*" + "9" * 30 + "**" + "30",
    ],
)
def test_huge_integers_are_refused(expression):
    assert kind_of(expression) == "too_large"
    assert calculator(expression) == "error: result too large (max 1000 digits)"


@pytest.mark.parametrize(
    "expression",
    [
        "1e308*10",
        "1e999",
        "1.5**100 * 1e300",
        "1e300**2",
        "10**200 / 1e-200",
        "1e308 // 1e-308",
        "(10**99)**10 / 1.0",
        "(10**99)**10 * 0.5",
        "(10**99)**10 ** 0.5",
        "(10**99)**10 / 3",
    ],
)
def test_floats_must_stay_finite(expression):
    assert kind_of(expression) == "too_large"


def test_a_long_sum_stays_within_bounds():
    assert evaluate("+".join(["10**99"] * 25)) == 25 * 10**99
    assert evaluate("-".join(["9" * 99] * 2)) == 0


def test_very_long_input_is_refused_before_parsing():
    assert kind_of("1+" * 10_000 + "1") == "too_long"
    assert kind_of("1" * 201) == "too_long"
    assert calculator("1" * 500) == "error: expression too long (500 characters, max 200)"
    assert evaluate("1" * 200) == int("1" * 200)


def test_deep_nesting_never_raises_recursion_error():
    assert kind_of("(" * 1000 + "1" + ")" * 1000) == "too_long"
    assert kind_of("-" * 199 + "1") == "too_deep"
    assert kind_of("-(" * 66 + "1" + ")" * 66) == "too_deep"
    assert evaluate("(" * 99 + "1" + ")" * 99) == 1  # parentheses leave no node
    # Beyond the length cap the parser and the checks still hold.
    unbounded = Limits(max_length=10**6, max_nodes=10**6)
    assert kind_of("(" * 1000 + "1" + ")" * 1000, unbounded) == "syntax"  # the parser's own nesting limit
    assert kind_of("-(" * 1000 + "1" + ")" * 1000, unbounded) in ("syntax", "too_deep")
    assert kind_of("-" * 1000 + "1", unbounded) == "too_deep"
    assert kind_of("-" * 100_000 + "1", unbounded) == "too_deep"
    assert kind_of("+".join(["1"] * 5000), unbounded) == "too_deep"


def test_depth_admits_a_flat_sum_of_64_terms():
    assert evaluate("+".join(["1"] * 64)) == 64
    assert kind_of("+".join(["1"] * 65)) == "too_deep"


def test_node_count_is_bounded():
    assert kind_of("+".join(["1"] * 300), Limits(max_length=10**4, max_depth=10**4)) == "too_long"


def test_time_limit():
    assert kind_of("1+1", Limits(time_limit=-1.0)) == "timeout"


def test_calculator_never_raises():
    for expression in ["9**9**9", "1/0", "x", "", "(" * 5000, "-" * 5000 + "1", "1e999", "(-1)**0.5", None]:
        assert calculator(expression).startswith("error: ")
