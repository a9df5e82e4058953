"""The keyed process function in one Python process, as a worker runs it: typed state handles
(value, list, map) across batches, processing-time timers at the batch's time, TTL, keys removed
when nothing is left, a state value of the wrong type, and what the DSL and the job's checks
refuse. The Spark side is test_keyed_state_spark.py's; a running query, tests/integration."""

from __future__ import annotations

import cloudpickle
import pyarrow as pa
import pytest

from funke.common.api.dsl import ExecutionEnvironment
from funke.common.api.state import KeyedProcessFunction, ListState, MapState, ValueState
from funke.common.graph.validation import JobGraphInvalid
from funke.common.streaming import state
from funke.common.streaming.state import MAX_TTL_MS, state_specs_problem
from funke.taskmanager.operators import keyedstate
from funke.taskmanager.operators.keyedstate import store

EVENTS = pa.schema([("user", pa.string()), ("page", pa.string()), ("n", pa.int64())])
GAP = 1_000  # a session closes when a batch runs this long (ms) after its last event


def group_of(user: str) -> int:
    return sum(user.encode()) % 8


class Sessions(KeyedProcessFunction):
    """A per-key state machine: a session opens with a user's first event, counts events and
    pages, and closes (emitting its totals) once GAP passes without an event."""
    state = (ValueState("events", "bigint"), ValueState("started", "bigint"), ListState("pages", "string"),
             MapState("per_page", "string", "bigint"))

    def process(self, user, rows, ctx):
        now = ctx.current_processing_time()
        if ctx.state.started.value() is None:
            ctx.state.started.update(now)
        ctx.state.events.update((ctx.state.events.value() or 0) + len(rows))
        for row in sorted(rows, key=lambda r: r.n):
            ctx.state.pages.add(row.page)
            ctx.state.per_page.put(row.page, ctx.state.per_page.get(row.page, 0) + 1)
        timers = ctx.timer_service()
        for t in timers.processing_time_timers():
            timers.delete_processing_time_timer(t)
        timers.register_processing_time_timer(now + GAP)
        return []

    def on_timer(self, user, timestamp, ctx):
        yield (user, ctx.state.started.value(), timestamp, ctx.state.events.value(), ",".join(ctx.state.pages.get()),
               dict(ctx.state.per_page.items()))
        for name in ("events", "started", "pages", "per_page"):
            ctx.get_state(name).clear()


SESSION_OUT = pa.schema([("user", pa.string()), ("started", pa.int64()), ("closed", pa.int64()), ("events", pa.int64()),
                         ("pages", pa.string()), ("per_page", pa.map_(pa.string(), pa.int64()))])


def state_schema(specs, event_timers: bool = True) -> pa.Schema:
    """The store's layout of a process function's state (without the event-time timers' column:
    as it was before they existed)."""
    fields = [pa.field("__funke_key_0", pa.string())]
    fields += [pa.field(name, arrow) for name, _, arrow, _, _ in specs]
    fields += [pa.field(state.expires_column(name), pa.int64()) for name, _, _, _, ttl in specs if ttl is not None]
    fields.append(pa.field(state.TIMERS_COLUMN, pa.list_(pa.int64())))
    if event_timers:
        fields.append(pa.field(state.EVENT_TIMERS_COLUMN, pa.list_(pa.int64())))
    return pa.schema(fields + [pa.field(state.REMOVED_COLUMN, pa.bool_())])


SESSION_SPECS = [("events", "value", pa.int64(), (), None), ("started", "value", pa.int64(), (), None),
                 ("pages", "list", pa.list_(pa.string()), (pa.string(),), None),
                 ("per_page", "map", pa.map_(pa.string(), pa.int64()), (pa.string(), pa.int64()), None)]


def run_batch(root, batch_id, now, rows, fn=None, specs=SESSION_SPECS, out=SESSION_OUT, watermark=None,
              layout=None):
    run = keyedstate.process_batches(cloudpickle.dumps(fn or Sessions()), str(root), ["user"], batch_id, now, 100,
                                     specs, layout or state_schema(specs), EVENTS, out, range(8),
                                     "operator 'P' (process)", watermark)
    batch = pa.RecordBatch.from_arrays([
        pa.array([u for u, _, _ in rows] + [None] * 8, pa.string()),
        pa.array([p for _, p, _ in rows] + [None] * 8, pa.string()),
        pa.array([n for _, _, n in rows] + [None] * 8, pa.int64()),
        pa.array([group_of(u) for u, _, _ in rows] + list(range(8)), pa.int32()),
        pa.array([False] * len(rows) + [True] * 8),
    ], names=[*EVENTS.names, state.KEY_GROUP_COLUMN, keyedstate.MARKER_COLUMN])
    return pa.Table.from_batches(list(run(iter([batch]))), schema=out).to_pylist()


def direct_sessions(feed):
    """The same state machine computed directly over (batch time, rows) in batch order."""
    open_: dict[str, dict] = {}
    closed = []
    for now, rows in feed:
        for user, page, n in sorted(rows, key=lambda r: (r[0], r[2])):
            s = open_.setdefault(user, {"started": now, "events": 0, "pages": [], "per_page": {}, "last": now})
            s["events"] += 1
            s["pages"].append(page)
            s["per_page"][page] = s["per_page"].get(page, 0) + 1
            s["last"] = now
        for user in sorted(open_):
            s = open_[user]
            if s["last"] + GAP <= now:
                closed.append((user, s["started"], s["last"] + GAP, s["events"], ",".join(s["pages"]),
                               sorted(s["per_page"].items())))
                del open_[user]
    return closed, set(open_)


FEED = [(10_000, [("ann", "home", 1), ("bob", "home", 1), ("ann", "cart", 2)]),
        (10_500, [("ann", "pay", 3)]),
        (11_200, [("cyd", "home", 1)]),  # bob's session (last event at 10 000) closes here
        (11_600, []),                    # ann's (10 500) closes
        (12_000, [("bob", "home", 2)]),  # bob starts a new session
        (13_500, [])]                    # cyd's and bob's close


def emitted(rows):
    return [(r["user"], r["started"], r["closed"], r["events"], r["pages"], sorted(r["per_page"])) for r in rows]


@pytest.mark.parametrize("cold", [False, True])
def test_sessions_with_timeouts_equal_a_direct_computation_and_closed_keys_leave_the_state(tmp_path, cold):
    got = []
    for batch_id, (now, rows) in enumerate(FEED):
        if cold:
            store._loaded().clear()  # every batch in a new worker: the state comes from the files
        got += emitted(run_batch(tmp_path, batch_id, now, rows))
    expected, still_open = direct_sessions(FEED)
    assert sorted(got) == sorted(expected) and still_open == set()
    assert [u for u, *_ in got].count("bob") == 2
    # every session closed: no key is left in any group, and the deltas said which left
    store._loaded().clear()
    for g in range(8):
        assert store.load_held(str(tmp_path), g, len(FEED), 1).rows == {}
    removed = keyedstate.measure(str(tmp_path), range(8), 6)  # the batch that closed cyd's and bob's
    assert removed.rows_removed == 2 and removed.rows_total == 0


def test_a_batch_that_fails_half_way_leaves_nothing_behind_and_its_rerun_sees_the_committed_state(tmp_path):
    run_batch(tmp_path, 0, 10_000, FEED[0][1])

    class Flaky(Sessions):
        def process(self, user, rows, ctx):
            out = super().process(user, rows, ctx)
            if user == "bob":
                raise RuntimeError("bob is cursed")
            return out

    with pytest.raises(RuntimeError, match="cursed"):
        run_batch(tmp_path, 1, 11_200, [("ann", "x", 9), ("bob", "x", 9)], fn=Flaky())
    # the re-run (any worker, this one included) starts from version 1 as committed
    assert emitted(run_batch(tmp_path, 1, 11_200, [("ann", "x", 9)])) == [
        ("bob", 10_000, 11_000, 1, "home", [("home", 1)])]


class EventSessions(KeyedProcessFunction):
    """Sessions over event time: the rows' `n` is their event time (ms); a session closes when
    the watermark passes its last event + GAP (an event-time timer), whatever the batches' times."""
    state = (ValueState("events", "bigint"), ValueState("last", "bigint"))

    def process(self, user, rows, ctx):
        timers = ctx.timer_service()
        last = ctx.state.last.value()
        if last is not None:
            timers.delete_event_time_timer(last + GAP)
        last = max([r.n for r in rows] + ([last] if last is not None else []))
        ctx.state.last.update(last)
        ctx.state.events.update((ctx.state.events.value() or 0) + len(rows))
        timers.register_event_time_timer(last + GAP)
        assert ctx.time_domain() is None

    def on_timer(self, user, timestamp, ctx):
        yield (user, ctx.state.events.value(), timestamp, ctx.current_watermark(), ctx.time_domain())
        ctx.state.events.clear()
        ctx.state.last.clear()


EVENT_SPECS = [("events", "value", pa.int64(), (), None), ("last", "value", pa.int64(), (), None)]
EVENT_OUT = pa.schema([("user", pa.string()), ("events", pa.int64()), ("closed", pa.int64()),
                       ("watermark", pa.int64()), ("domain", pa.string())])


@pytest.mark.parametrize("cold", [False, True])
def test_event_time_timers_fire_when_the_watermark_passes_them_not_the_batch_time(tmp_path, cold):
    # (batch time, watermark, rows (user, page, event time)): the batches' times race ahead of
    # the events' times; only the watermark closes a session
    feed = [(50_000, None, [("ann", "a", 1_000), ("bob", "a", 1_200)]),
            (60_000, 1_500, [("ann", "b", 1_900)]),      # ann's timer moves from 2 000 to 2 900
            (70_000, 2_300, []),                          # bob's timer (2 200) fires: watermark 2 300
            (80_000, 2_800, [("cyd", "a", 2_850)]),       # ann's (2 900) not yet
            (90_000, 4_000, [])]                          # ann's (2 900) and cyd's (3 850) fire
    got = []
    for batch_id, (now, watermark, rows) in enumerate(feed):
        if cold:
            store._loaded().clear()
        got.append([tuple(r.values()) for r in run_batch(tmp_path, batch_id, now, rows, EventSessions(), EVENT_SPECS,
                                                         EVENT_OUT, watermark)])
    assert [sorted(b) for b in got] == [[], [], [("bob", 1, 2_200, 2_300, "EVENT_TIME")], [],
                                        [("ann", 2, 2_900, 4_000, "EVENT_TIME"), ("cyd", 1, 3_850, 4_000, "EVENT_TIME")]]
    store._loaded().clear()
    assert all(store.load_held(str(tmp_path), g, len(feed), 1).rows == {} for g in range(8))


def test_state_written_before_event_time_timers_existed_loads_and_gets_them(tmp_path):
    old = state_schema(SESSION_SPECS, event_timers=False)
    run_batch(tmp_path, 0, 10_000, FEED[0][1], layout=old)  # ann and bob open, a processing-time timer each
    store._loaded().clear()  # a new worker reads the old layout from the files

    class Both(Sessions):
        def process(self, user, rows, ctx):
            super().process(user, rows, ctx)
            ctx.timer_service().register_event_time_timer(5_000)

        def on_timer(self, user, timestamp, ctx):
            if ctx.time_domain() == "EVENT_TIME":
                return [(user, None, timestamp, None, "event", {})]
            return super().on_timer(user, timestamp, ctx)

    out = emitted(run_batch(tmp_path, 1, 10_500, [("ann", "pay", 3)], Both(), watermark=6_000))
    # ann's new event-time timer fires at the watermark; bob's processing-time one (11 000) waits
    assert out == [("ann", None, 5_000, None, "event", [])]
    assert emitted(run_batch(tmp_path, 2, 11_200, [], Both(), watermark=6_000)) == [
        ("bob", 10_000, 11_000, 1, "home", [("home", 1)])]


TTL_SPECS = [("last", "value", pa.string(), (), 1_000), ("seen", "map", pa.map_(pa.string(), pa.int64()),
                                                        (pa.string(), pa.int64()), None)]
TTL_OUT = pa.schema([("user", pa.string()), ("previous", pa.string())])


def remember(user, rows, ctx):
    """Emits the page the user saw last, as long as it was seen within the TTL (1 s)."""
    previous = ctx.state.last.value()
    ctx.state.last.update(max(r.page for r in rows))
    return [(user, previous)]


def test_a_value_with_a_ttl_reads_empty_once_it_expired_and_expired_keys_are_swept_at_a_snapshot(tmp_path):
    fn = KeyedProcessFunction()
    fn.process = remember
    times = [0, 500, 1_400, 2_500, 2_600, 5_000, 5_100, 5_200, 5_300, 5_400]
    feeds = [[("ann", "a", 0)], [("ann", "b", 0)], [("ann", "c", 0)], [("ann", "d", 0)], [("bob", "z", 0)],
             [], [], [], [], []]
    got = [run_batch(tmp_path, b, now, rows, fn, TTL_SPECS, TTL_OUT) for b, (now, rows) in enumerate(zip(times, feeds))]
    assert got[:5] == [[{"user": "ann", "previous": None}], [{"user": "ann", "previous": "a"}],
                       [{"user": "ann", "previous": "b"}],  # written at 500, expires at 1 500
                       [{"user": "ann", "previous": None}],  # written at 1 400: expired at 2 400
                       [{"user": "bob", "previous": None}]]
    # version 10 is a snapshot version: both keys expired by 5 400 and leave the state
    assert keyedstate.measure(str(tmp_path), range(8), 10).rows_removed == 2
    store._loaded().clear()
    assert all(store.load_held(str(tmp_path), g, 10, 1).rows == {} for g in range(8))


def test_a_state_value_of_the_wrong_type_is_an_error_naming_the_state_and_the_key(tmp_path):
    def bad(user, rows, ctx):
        ctx.state.events.update("many" if user == "bob" else 1)

    fn = KeyedProcessFunction()
    fn.process = bad
    with pytest.raises(keyedstate.StateValueError, match=r"state 'events' of key \('bob',\): 'many' \(str\) cannot be "
                                                         r"stored as int64"):
        run_batch(tmp_path, 0, 0, [("ann", "x", 1), ("bob", "x", 1)], fn)


def test_a_function_that_returns_one_row_instead_of_rows_is_told_so(tmp_path):
    fn = KeyedProcessFunction()
    fn.process = lambda user, rows, ctx: {"user": user}
    with pytest.raises(TypeError, match="return or yield rows"):
        run_batch(tmp_path, 0, 0, [("ann", "x", 1)], fn)


def test_state_outside_a_key_and_undeclared_state_are_told_plainly(tmp_path):
    class Early(Sessions):
        def open(self, ctx):
            self.events = ctx.get_state("events")  # PyFlink's way: the handle follows the current key
            self.events.value()

    with pytest.raises(RuntimeError, match="no current key"):
        run_batch(tmp_path, 0, 0, [("ann", "x", 1)], Early())

    fn = KeyedProcessFunction()
    fn.process = lambda user, rows, ctx: ctx.state.nope.value()
    with pytest.raises(AttributeError, match="no state named 'nope'"):
        run_batch(tmp_path / "2", 0, 0, [("ann", "x", 1)], fn)


# ------------------------------------------------------------------------------ the job's side

def events_query():
    env = ExecutionEnvironment("sessions", "streaming", parallelism=2)
    return env, env.read_stream.json_lines("/tmp/in", schema="user string, page string, n bigint")


def test_the_dsl_records_the_declared_state_and_the_job_checks_it():
    env, events = events_query()
    events.key_by("user").process(Sessions(), schema="user string, started bigint, closed bigint, events bigint, "
                                  "pages string, per_page map<string,bigint>").discard()
    job = env.build()
    op = next(op for v in job.vertices for op in v.operators if op.kind == "process")
    assert [s["name"] for s in op.config["state"]] == ["events", "started", "pages", "per_page"]
    assert op.config["state"][3] == {"name": "per_page", "kind": "map", "key_type": "string", "type": "bigint"}
    assert cloudpickle.loads(op.function).state[0].name == "events"

    env, events = events_query()
    events.key_by("user").process(remember, schema="user string, previous string",
                                  state=[ValueState("last", "string", ttl="30 min")]).discard()
    op = next(op for v in env.build().vertices for op in v.operators if op.kind == "process")
    assert op.config["state"] == [{"name": "last", "kind": "value", "type": "string", "ttl_ms": 1_800_000}]


@pytest.mark.parametrize("state_, message", [
    ([ValueState("a", "bigint", ttl=0)], "ttl_ms must be whole milliseconds from 1"),
    ([ValueState("a", "bigint", ttl=MAX_TTL_MS + 1)], "ten years"),
    ([ValueState("a", "bigint"), ListState("a", "string")], "declared twice"),
    ([ValueState("no spaces", "bigint")], "must be an identifier"),
])
def test_a_ttl_or_state_handle_out_of_range_makes_the_job_invalid(state_, message):
    env, events = events_query()
    events.key_by("user").process(remember, schema="user string, previous string", state=state_).discard()
    with pytest.raises(JobGraphInvalid, match=message):
        env.build()


def test_hostile_state_configs_read_as_problems_not_crashes():
    assert state_specs_problem([{"name": "a", "kind": "value", "type": "bigint"}]) is None
    assert "kind must be one of" in state_specs_problem([{"name": "a", "kind": "heap", "type": "x"}])
    assert "unknown field" in state_specs_problem([{"name": "a", "kind": "value", "type": "x", "key_type": "y"}])
    assert "type must be a Spark type" in state_specs_problem([{"name": "a", "kind": "map", "type": "bigint"}])
    assert "at most 32" in state_specs_problem([{"name": f"s{i}", "kind": "value", "type": "int"} for i in range(33)])
    assert "must be a list" in state_specs_problem({"name": "a"})
    assert "ttl_ms" in state_specs_problem([{"name": "a", "kind": "value", "type": "int", "ttl_ms": True}])


def test_process_is_for_streams_and_needs_its_output_schema():
    env = ExecutionEnvironment("bounded", parallelism=1)
    with pytest.raises(ValueError, match="this stream is bounded"):
        env.from_range(0, 10).key_by("id").process(remember, schema="id bigint")
    _, events = events_query()
    with pytest.raises(ValueError, match="per_batch"):
        events.key_by("user").per_batch().process(remember, schema="user string, previous string")
    with pytest.raises(TypeError, match="needs the schema"):
        events.key_by("user").process(remember)
    with pytest.raises(TypeError, match="ValueState, ListState and MapState"):
        events.key_by("user").process(remember, schema="u string", state=["count"])


def test_the_jobmanager_shows_a_process_functions_state_without_removed_keys(tmp_path):
    from funke.common.graph.jobgraph import JobVertex, OperatorSpec
    from funke.jobmanager.streaming.state import keyed_state_table

    root = tmp_path / "state" / "sessions" / "op-0"
    for batch_id, (now, rows) in enumerate(FEED[:3]):
        run_batch(root, batch_id, now, rows)
    vertex = JobVertex("sessions", "sessions", 1, (OperatorSpec("process", "P", {
        "keys": ["user"], "schema": "x int", "state": [s.spec() for s in Sessions.state]}),), max_parallelism=8)
    table, matching = keyed_state_table(vertex, str(tmp_path), 3, [], 100)
    assert table.column_names == ["user", "events", "started", "pages", "per_page", "timers", "event_timers"]
    by_user = {r["user"]: r for r in table.to_pylist()}
    assert sorted(by_user) == ["ann", "cyd"] and matching == 2  # bob's session closed at 11 200
    assert by_user["ann"]["events"] == 3 and by_user["ann"]["timers"] == [11_500]
    assert by_user["ann"]["event_timers"] is None
    assert dict(by_user["ann"]["per_page"]) == {"home": 1, "cart": 1, "pay": 1}


def test_the_sessions_example_builds_a_query_with_a_process_function_whose_state_has_its_ttl(tmp_path):
    import importlib.util

    from funke.common.wire.codec import job_graph_from_proto, job_graph_to_proto

    spec = importlib.util.spec_from_file_location("sessions_example", "examples/sessions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    job = job_graph_from_proto(job_graph_to_proto(module.build(["--input", str(tmp_path), "--gap", "5000"])))
    (op,) = [op for v in job.vertices for op in v.operators if op.kind == "process"]
    assert [(s["name"], s["kind"], s["ttl_ms"]) for s in op.config["state"]] == [
        ("started", "value", 3_600_000), ("clicks", "value", 3_600_000), ("pages", "list", 3_600_000),
        ("per_page", "map", 3_600_000)]
    fn = cloudpickle.loads(op.function)
    assert fn.gap_ms == 5000
    # the function run as a worker runs it: a session of two clicks, closed by its timer
    events = pa.schema([("user", pa.string()), ("page", pa.string())])
    out = pa.schema([("user", pa.string()), ("started", pa.int64()), ("closed", pa.int64()), ("clicks", pa.int64()),
                     ("pages", pa.string()), ("top_page", pa.string())])
    specs = [("started", "value", pa.int64(), (), 3_600_000), ("clicks", "value", pa.int64(), (), 3_600_000),
             ("pages", "list", pa.list_(pa.string()), (pa.string(),), 3_600_000),
             ("per_page", "map", pa.map_(pa.string(), pa.int64()), (pa.string(), pa.int64()), 3_600_000)]

    def batch(batch_id, now, rows):
        run = keyedstate.process_batches(op.function, str(tmp_path / "state"), ["user"], batch_id, now, 100, specs,
                                         state_schema(specs), events, out, range(8), "sessions")
        b = pa.RecordBatch.from_arrays([
            pa.array([u for u, _ in rows] + [None] * 8, pa.string()), pa.array([p for _, p in rows] + [None] * 8),
            pa.array([group_of(u) for u, _ in rows] + list(range(8)), pa.int32()),
            pa.array([False] * len(rows) + [True] * 8)], names=["user", "page", state.KEY_GROUP_COLUMN,
                                                                 keyedstate.MARKER_COLUMN])
        return pa.Table.from_batches(list(run(iter([b]))), schema=out).to_pylist()

    assert batch(0, 1_000, [("ann", "/a"), ("ann", "/b")]) == []
    assert batch(1, 3_000, [("ann", "/b")]) == []
    assert batch(2, 8_000, []) == [{"user": "ann", "started": 1_000, "closed": 8_000, "clicks": 3,
                                    "pages": "/a /b", "top_page": "/b"}]


def test_a_batchs_cyclic_garbage_is_collected_even_though_the_collector_is_off_during_the_batch(tmp_path):
    import gc
    import weakref

    class Node:
        pass

    import tests.unit.test_process_function as here  # by reference: the function runs unpickled

    made = here.MADE = []

    def cyclic(user, rows, ctx):
        import tests.unit.test_process_function as here

        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle only the cyclic collector frees
        here.MADE.append(weakref.ref(a))
        return []

    fn = KeyedProcessFunction()
    fn.process = cyclic
    run_batch(tmp_path, 0, 0, [("ann", "x", 1), ("bob", "y", 2)], fn)
    assert len(made) == 2 and gc.isenabled()
    assert all(ref() is None for ref in made), "the batch's cycles outlived it"
