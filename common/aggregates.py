"""How a keyed SQL aggregate splits into a combiner before the exchange and a final aggregate
after it (Spark's partial aggregation, MapReduce's combiner): the exchange then carries one row
per key and producer subtask instead of every row.

Owns the rules, as text: which aggregate calls split (`count`, `sum`, `min`, `max`, `avg`/`mean`,
without DISTINCT) and what each becomes on either side. The TaskManager's `combine` operator
applies them once it knows the input's schema (the output names and types the aggregate would
have are Spark's to say); a call that does not split keeps the whole aggregate after the
exchange, as if there were no combiner. A streaming query's running aggregate keeps the same
partials as its state across batches (`funke.common.streaming.state`), so it takes only calls that
split.

Pure: strings in, strings out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PARTIAL_PREFIX = "__funke_partial_"
# The final aggregate's expression for a partial column rides in the column's metadata, so that
# the aggregate after the exchange needs nothing but its input.
FINAL_KEY = "funke.final"
INDEX_KEY = "funke.final.index"

_CALL = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.S)
_ALIAS = re.compile(r"\s*(?:[Aa][Ss]\s+)?(`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)\s*", re.S)
# What a running aggregate of a streaming query accepts (its state holds the partial aggregates).
RUNNING_ONLY = ("a running aggregate takes count, sum, min, max and avg (or mean) calls, one per expression, "
                "each optionally with an alias (\"sum(n) AS total\"); not DISTINCT, nor arithmetic around a call")
_SPLITTING = {"count": "count", "sum": "sum", "min": "min", "max": "max", "avg": "avg", "mean": "avg"}


@dataclass(frozen=True, slots=True)
class AggregateCall:
    """`function(argument) [AS alias]`, the whole of one aggregate expression."""
    function: str  # lower case; `mean` is `avg`
    argument: str
    alias: str | None  # as written, backticks included


def parse_call(text: str) -> AggregateCall | None:
    """The call `text` is, if it is exactly one call of an aggregate that splits (None otherwise:
    `sum(a) / 2`, `count(DISTINCT a)`, `percentile(a, 0.5)`)."""
    m = _CALL.match(text)
    if m is None or m.group(1).lower() not in _SPLITTING:
        return None
    end = _closing(text, m.end() - 1)
    if end is None:
        return None
    argument = text[m.end():end].strip()
    if not argument or re.match(r"(?i)distinct\b", argument) or _top_level_comma(argument):
        return None
    rest = text[end + 1:]
    alias = None
    if rest.strip():
        a = _ALIAS.fullmatch(rest)
        if a is None:
            return None
        alias = a.group(1)
    return AggregateCall(_SPLITTING[m.group(1).lower()], argument, alias)


def partials(call: AggregateCall, index: int) -> list[tuple[str, str]]:
    """The combiner's columns for aggregate `index`: (name, expression)."""
    name = f"{PARTIAL_PREFIX}{index}"
    if call.function == "avg":  # Spark's Average: the sum as a double, and the count
        return [(f"{name}_sum", f"sum(CAST(({call.argument}) AS DOUBLE))"), (f"{name}_count", f"count({call.argument})")]
    return [(name, f"{call.function}({call.argument})")]


def final(call: AggregateCall, index: int, output_name: str, output_type: str) -> str:
    """The final aggregate over the combiner's columns, with the name and type (a SQL type) the
    whole aggregate has."""
    name = f"{PARTIAL_PREFIX}{index}"
    if call.function == "avg":
        merged = f"sum(`{name}_sum`) / sum(`{name}_count`)"
    else:  # counts add up; sums, minima and maxima merge as themselves
        merged = f"{'sum' if call.function == 'count' else call.function}(`{name}`)"
    return f"CAST({merged} AS {output_type}) AS {quote(output_name)}"


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _closing(text: str, opening: int) -> int | None:
    """The index of the parenthesis that closes the one at `opening` (quotes respected)."""
    depth, i, quote_char = 0, opening, ""
    while i < len(text):
        c = text[i]
        if quote_char:
            if c == "\\" and quote_char != "`":
                i += 1  # an escaped character inside a string literal
            elif c == quote_char:
                quote_char = ""
        elif c in "'\"`":
            quote_char = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _top_level_comma(text: str) -> bool:
    depth, quote_char, escaped = 0, "", False
    for c in text:
        if escaped:
            escaped = False
        elif quote_char:
            if c == "\\" and quote_char != "`":
                escaped = True
            elif c == quote_char:
                quote_char = ""
        elif c in "'\"`":
            quote_char = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "," and depth == 0:
            return True
    return False
