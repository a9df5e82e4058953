"""What an id or a name from a request may be, and how much of it a message may echo.

Owns the one rule for every client-chosen identifier. Validation applies it to each JobGraph
field; `layout.py` applies it again to every path component it builds, so a path made from an
id can never leave its root, whichever caller forgot to validate.

Two kinds of identifier:

- **path ids** name things on disk and in Spark job tags and metric labels: job ids, vertex ids,
  data set ids, artifact names, TaskManager ids. 1 to 200 characters (job ids: 64) of
  `A-Z a-z 0-9 . _ -`, starting with a letter or a digit. So `..`, `.hidden`, `a/b`, `a\\b`,
  NUL, spaces and newlines are all refused, and a path id is always one plain path component.
- **labels** only ever appear in messages: edge ids (the DSL writes `map->sink`), slot-sharing
  and co-location group names. 1 to 300 characters of any script, spaces included, but no
  control or format characters (NUL, newline, tab, a right-to-left override ...) and no leading
  or trailing space.

Names (a job's or a vertex's display name) and column names follow the label rule, at most
`MAX_NAME_LENGTH` characters (names may be empty; column names may have outer spaces).
"""

from __future__ import annotations

import re
import unicodedata

MAX_JOB_ID_LENGTH = 64
MAX_PATH_ID_LENGTH = 200
MAX_LABEL_LENGTH = 300
MAX_NAME_LENGTH = 1000
# What an error message quotes of a value the client sent (its repr, shortened).
ECHO_LIMIT = 80

_PATH_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
PATH_ID_RULE = "letters, digits, '.', '_' and '-', starting with a letter or a digit"


def echo(value: object, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)`, cut to about `limit` characters with the full length noted: what an error
    message may quote of something a client sent (a 1 MiB id must not become a 1 MiB message)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value):,} characters" if isinstance(value, (str, bytes)) else f"{len(text):,} characters shown"
    return f"{text[:limit]}... ({size})"


# gRPC carries a status message percent-encoded in trailing metadata, which clients refuse beyond
# 8-16 KiB: a message is cut to this many encoded bytes.
MAX_STATUS_MESSAGE_BYTES = 7000


def status_message(text: str, max_bytes: int = MAX_STATUS_MESSAGE_BYTES) -> str:
    """`text` cut, where needed, so that its percent-encoded UTF-8 form (every byte outside
    0x20-0x7E, and '%', takes three) fits in `max_bytes`."""
    size = 0
    for i, ch in enumerate(text):
        size += _encoded_size(ch)
        if size > max_bytes - 60:
            return text[:i] + f"\n... (cut: the whole message has {len(text):,} characters)"
    return text


def _encoded_size(ch: str) -> int:
    if " " <= ch <= "~" and ch != "%":
        return 1
    return 3 * len(ch.encode("utf-8", "surrogatepass"))


def path_id_problem(value: object, what: str, max_length: int = MAX_PATH_ID_LENGTH) -> str | None:
    """Why `value` is not a valid path id (None if it is). `what` names it: "job id"."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__}"
    if not value:
        return f"{what} is empty"
    if len(value) > max_length:
        return f"{what} {echo(value)} is longer than {max_length} characters"
    if not _PATH_ID.fullmatch(value):
        return f"{what} {echo(value)} may only contain {PATH_ID_RULE}"
    return None


def job_id_problem(value: object) -> str | None:
    return path_id_problem(value, "job id", MAX_JOB_ID_LENGTH)


def label_problem(value: object, what: str, max_length: int = MAX_LABEL_LENGTH) -> str | None:
    """Why `value` is not a valid label (None if it is)."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__}"
    if not value:
        return f"{what} is empty"
    if len(value) > max_length:
        return f"{what} {echo(value)} is longer than {max_length} characters"
    if has_control_characters(value):
        return f"{what} {echo(value)} contains control characters"
    if value != value.strip():
        return f"{what} {echo(value)} starts or ends with whitespace"
    return None


def name_problem(value: object, what: str, max_length: int = MAX_NAME_LENGTH, *, empty_ok: bool = True) -> str | None:
    """Why `value` is not a valid display name (None if it is). Names may be empty."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__}"
    if not value:
        return None if empty_ok else f"{what} is empty"
    if len(value) > max_length:
        return f"{what} {echo(value)} is longer than {max_length} characters"
    if has_control_characters(value):
        return f"{what} {echo(value)} contains control characters"
    return None


def has_control_characters(value: str) -> bool:
    """Control, format, surrogate, private-use or unassigned characters, or line and paragraph
    separators: what would break a line, hide text or reorder it. Spaces of any script are fine."""
    if value.isascii():
        return not value.isprintable()
    return any(unicodedata.category(c)[0] == "C" or unicodedata.category(c) in ("Zl", "Zp") for c in value)


def is_path_id(value: object, max_length: int = MAX_PATH_ID_LENGTH) -> bool:
    return path_id_problem(value, "id", max_length) is None


def require_path_id(value: object, what: str, max_length: int = MAX_PATH_ID_LENGTH) -> str:
    """`value` if it is a valid path id, else ValueError naming it."""
    problem = path_id_problem(value, what, max_length)
    if problem is not None:
        raise ValueError(problem)
    return value  # type: ignore[return-value]
