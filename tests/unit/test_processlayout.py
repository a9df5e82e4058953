"""A keyed process function's state row, declared once (`funke.common.streaming.processlayout`):
the planner's schema, the worker's positions and `funke state`'s columns agree."""

from __future__ import annotations

import pyarrow as pa

from funke.common.streaming import state
from funke.common.streaming.processlayout import ProcessLayout, key_column

DECLARED = [{"name": "count", "kind": "value", "type": "bigint"},
            {"name": "seen", "kind": "list", "type": "string", "ttl_ms": 60_000},
            {"name": "pages", "kind": "map", "type": "bigint", "key_type": "string", "ttl_ms": 1_000}]


def test_the_row_is_the_keys_the_states_their_expiries_the_timers_then_removed():
    layout = ProcessLayout.of(2, DECLARED)
    assert layout.columns() == ["__funke_key_0", "__funke_key_1", "count", "seen", "pages",
                                state.expires_column("seen"), state.expires_column("pages"),
                                state.TIMERS_COLUMN, state.EVENT_TIMERS_COLUMN, state.REMOVED_COLUMN]
    # positions in a key's values (the row without its key)
    values = layout.value_columns()
    assert layout.expires_at == {1: values.index(state.expires_column("seen")),
                                 2: values.index(state.expires_column("pages"))}
    assert values[layout.timers_at] == state.TIMERS_COLUMN
    assert values[layout.event_timers_at] == state.EVENT_TIMERS_COLUMN
    assert layout.width == len(values) == 7


def test_a_row_written_before_event_time_timers_is_padded():
    layout = ProcessLayout.of(1, [{"name": "n", "kind": "value", "type": "int"}])
    old = [1, [5]]  # the state, its processing-time timers
    layout.pad(old)
    assert old == [1, [5], None]
    layout.pad(old)
    assert old == [1, [5], None]


def test_funke_state_shows_the_keys_by_name_the_states_and_the_timers():
    layout = ProcessLayout.of(1, DECLARED)
    assert layout.shown(["user"], layout.columns()) == [
        ("user", key_column(0)), ("count", "count"), ("seen", "seen"), ("pages", "pages"),
        ("timers", state.TIMERS_COLUMN), ("event_timers", state.EVENT_TIMERS_COLUMN)]
    without = [c for c in layout.columns() if c != state.EVENT_TIMERS_COLUMN]
    assert layout.shown(["user"], without)[-1] == ("timers", state.TIMERS_COLUMN)


def test_the_workers_schema_names_its_columns_as_the_layout_does():
    from funke.taskmanager.operators.keyedstate.process import HANDLES, state_schema, state_spec

    specs = [state_spec(d["name"], d["kind"], pa.int64(), pa.string() if d["kind"] == "map" else None,
                        d.get("ttl_ms")) for d in DECLARED]
    schema = state_schema([pa.string()], specs)
    assert schema.names == ProcessLayout.of(1, DECLARED).columns()
    assert schema.field("seen").type == pa.list_(pa.int64())
    assert schema.field("pages").type == pa.map_(pa.string(), pa.int64())
    assert sorted(HANDLES) == sorted(state.STATE_KINDS)  # every kind of state has its handle
