"""A keyed process function's state row, declared once: which column holds what. The planner
builds the store's Arrow schema from it (`funke.taskmanager.operators.transforms._process`), the
Python workers read and write each key's row by its positions
(`funke.taskmanager.operators.keyedstate.process`), and `funke state` shows a row's columns by
its names (`funke.jobmanager.streaming.state`).

A row is the key's columns (`__funke_key_<i>`), then its values: each declared state in the
order declared, the expiry (epoch ms) of each state with a TTL in the same order, the
processing-time timers, the event-time timers (epoch ms, ascending; a row written before
event-time timers existed has no such column: `pad` gives it one), and last the store's
REMOVED_COLUMN.

Pure, and pickled by value into Spark's Python workers with the keyed operators, so it imports
nothing of funke but the rules module beside it (pickled by value too).
"""

from __future__ import annotations

from dataclasses import dataclass

from funke.common.streaming.state import EVENT_TIMERS_COLUMN, REMOVED_COLUMN, TIMERS_COLUMN, expires_column

__all__ = ["ProcessLayout", "StateDecl", "key_column"]


def key_column(i: int) -> str:
    """The name of the state's i-th key column (a running reduce's state names its keys so too)."""
    return f"__funke_key_{i}"


@dataclass(frozen=True, slots=True)
class StateDecl:
    """One declared state: its name, kind (`STATE_KINDS`) and TTL (ms, None: kept until cleared)."""

    name: str
    kind: str
    ttl_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessLayout:
    n_keys: int
    states: tuple[StateDecl, ...]

    @classmethod
    def of(cls, n_keys: int, declared: list[dict] | None) -> ProcessLayout:
        """From the operator's config "state" (checked by `state_specs_problem`)."""
        return cls(n_keys, tuple(StateDecl(d["name"], d["kind"], d.get("ttl_ms")) for d in declared or ()))

    @property
    def expires_at(self) -> dict[int, int]:
        """State index -> where in a key's values its expiry is (the states with a TTL)."""
        with_ttl = [i for i, s in enumerate(self.states) if s.ttl_ms is not None]
        return {i: len(self.states) + j for j, i in enumerate(with_ttl)}

    @property
    def timers_at(self) -> int:
        """Where in a key's values its processing-time timers are."""
        return len(self.states) + sum(1 for s in self.states if s.ttl_ms is not None)

    @property
    def event_timers_at(self) -> int:
        return self.timers_at + 1

    @property
    def width(self) -> int:
        """The number of a key's values."""
        return self.timers_at + 2

    def key_columns(self) -> list[str]:
        return [key_column(i) for i in range(self.n_keys)]

    def value_columns(self) -> list[str]:
        return ([s.name for s in self.states] + [expires_column(s.name) for s in self.states if s.ttl_ms is not None]
                + [TIMERS_COLUMN, EVENT_TIMERS_COLUMN])

    def columns(self) -> list[str]:
        """The store's columns, in order (the Arrow schema's names)."""
        return self.key_columns() + self.value_columns() + [REMOVED_COLUMN]

    def pad(self, values: list) -> None:
        """A key's values as read from a version written before event-time timers: given none."""
        if len(values) < self.width:
            values.extend([None] * (self.width - len(values)))

    def shown(self, keys: list[str], present: list[str]) -> list[tuple[str, str]]:
        """What `funke state` shows of a row, as (name shown, column): the key by its names, each
        state, the timers (not the TTLs' expiry times); the event-time timers when the version
        has them (`present`: its columns)."""
        shown = [(k, key_column(i)) for i, k in enumerate(keys)] + [(s.name, s.name) for s in self.states]
        shown.append(("timers", TIMERS_COLUMN))
        if EVENT_TIMERS_COLUMN in present:
            shown.append(("event_timers", EVENT_TIMERS_COLUMN))
        return shown
