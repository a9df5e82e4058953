"""User code keeps its file name and source lines on its way to the Python workers.

cloudpickle ships code by value but names the file of every code object it carries
`<dynamic-code>` (to make its payload deterministic), so a function that raised in a task showed
`File "<dynamic-code>", line 12, in parse` in `funke status` and in `execute()`'s JobFailed: no
file, no source line. `dumps` pickles as cloudpickle does, except that each code object carried
by value (whatever holds it: a plain function, a lambda, a nested function, a method of a class
defined in the job file, the function of a bound method, a helper those call...) pickles to a
call of `_in_file` with the code's own file name and that file's lines (as `linecache` has them
on the client: a script's file, or a notebook cell, which IPython registers there; each file's
lines once per payload). Unpickling gives back the objects themselves, their code named after
the file again, and the lines in the worker's `linecache`, so a traceback reads as it would on
the user's machine.

The functions that run in the worker travel by value with the user's code (the workers need
not have funke installed): `_in_file` uses only the standard library; `dumps`, which runs on the
client only, imports cloudpickle when called.
"""

from __future__ import annotations

import io
import linecache
import sys
import types
from typing import Any

MAX_SOURCE_CHARS = 1_000_000  # a bigger file travels without its lines (names and numbers still do)


def dumps(obj: Any) -> bytes:
    """`cloudpickle.dumps(obj)`, each code object carried by value with its file's name and lines."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # `_in_file` runs where funke may not be
    with io.BytesIO() as file:
        _pickler_class()(file).dump(obj)
        return file.getvalue()


def _in_file(code: types.CodeType, filename: str, lines: tuple[str, ...]) -> types.CodeType:
    """In the worker: `code` (the code it defines inside already renamed on its way) named after
    `filename`, and the file's lines in `linecache` (the latest payload's, should two jobs ship
    different versions of one path to a long-lived worker)."""
    if lines:
        cached = linecache.cache.get(filename)
        if cached is None or len(cached) != 4 or tuple(cached[2]) != lines:
            # mtime None: linecache.checkcache keeps the entry (the worker may have no such file)
            linecache.cache[filename] = (sum(len(line) for line in lines), None, list(lines), filename)
    return code.replace(co_filename=filename)


_OWN_FILE = _in_file.__code__.co_filename  # this module's code travels as cloudpickle has it
_pickler: type | None = None


def _pickler_class() -> type:
    """cloudpickle's Pickler, with code objects reduced through `_in_file` (made on first use:
    importing this module must not import cloudpickle)."""
    global _pickler
    if _pickler is not None:
        return _pickler
    import cloudpickle

    # cloudpickle's reduction of a code object (its dispatch table is the pickle protocol's
    # public hook), with the file named <dynamic-code>
    plain_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]

    class _AsCloudpickleHasIt:
        """Pickles to cloudpickle's own reconstruction of `code`: the argument of `_in_file`."""

        __slots__ = ("code",)

        def __init__(self, code: types.CodeType) -> None:
            self.code = code

        def __reduce__(self) -> tuple[Any, ...]:
            return plain_reduce(self.code)

    class SourcePickler(cloudpickle.Pickler):
        def __init__(self, file: io.BytesIO) -> None:
            super().__init__(file)
            self._lines: dict[str, tuple[str, ...]] = {}

        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is types.CodeType and obj.co_filename != _OWN_FILE:
                return _in_file, (_AsCloudpickleHasIt(obj), obj.co_filename, self._lines_of(obj.co_filename))
            return super().reducer_override(obj)

        def _lines_of(self, filename: str) -> tuple[str, ...]:
            # one tuple per file and payload: pickle's memo writes it once, however many codes share it
            lines = self._lines.get(filename)
            if lines is None:
                lines = tuple(linecache.getlines(filename))
                if sum(len(line) for line in lines) > MAX_SOURCE_CHARS:
                    lines = ()
                self._lines[filename] = lines
            return lines

    _pickler = SourcePickler
    return _pickler
