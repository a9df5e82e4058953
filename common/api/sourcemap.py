"""A user function keeps its file name and source lines on its way to the Python workers.

cloudpickle ships a function's code by value but names its file `<dynamic-code>`, so a function
that raises in a task showed `File "<dynamic-code>", line 12, in parse` in `funke status` and in
`execute()`'s JobFailed: no file, no source line. `attach` wraps a function with its file's name
and lines (as `linecache` has them: a script's file, or a notebook cell, which IPython registers
there); unpickling the wrapper gives back the function itself, its code (and the code of what it
defines inside) named after the file again, and the lines in the worker's `linecache`, so a
traceback reads as it would on the user's machine.

This module travels by value with the functions (the workers need not have funke installed):
it imports only the standard library.
"""

from __future__ import annotations

import linecache
import types
from typing import Any

MAX_SOURCE_CHARS = 1_000_000  # a bigger file travels without its lines (names and numbers still do)


class WithSource:
    """`fn` with its file's name and lines; pickles to a call of `restore`."""

    __slots__ = ("fn", "filename", "lines")

    def __init__(self, fn: Any, filename: str, lines: tuple[str, ...]):
        self.fn = fn
        self.filename = filename
        self.lines = lines

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return restore, (self.fn, self.filename, self.lines)


def attach(fn: Any) -> Any:
    """`fn` wrapped with its source for pickling, or `fn` as it is if it is no plain function."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or not isinstance(fn, types.FunctionType):
        return fn
    lines = linecache.getlines(code.co_filename)
    if sum(len(line) for line in lines) > MAX_SOURCE_CHARS:
        lines = []
    return WithSource(fn, code.co_filename, tuple(lines))


def restore(fn: Any, filename: str, lines: tuple[str, ...]) -> Any:
    """In the worker: `fn`, its code named after `filename`, the lines in `linecache`."""
    if lines and filename not in linecache.cache:
        # mtime None: linecache.checkcache keeps the entry (there is no such file to compare with)
        linecache.cache[filename] = (sum(len(line) for line in lines), None, list(lines), filename)
    code = getattr(fn, "__code__", None)
    if isinstance(code, types.CodeType) and code.co_filename != filename:
        fn.__code__ = _renamed(code, filename)
    return fn


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)
