"""Sessions per user over a stream of click events: a keyed process function with typed state and
processing-time timers (Flink's KeyedProcessFunction, Structured Streaming's transformWithState).
A user's session opens with their first click, counts clicks and pages, and closes, emitting one
row, once --gap passes without a click from them; a session whose user never comes back is
forgotten after --ttl all the same.

Run it on a cluster with:

    funke submit examples/sessions.py -- --input /tmp/clicks --output /tmp/sessions
    funke state JOB             # the open sessions: each user's clicks, pages and timer
    funke rescale JOB -p 4      # live, at a batch boundary; the sessions move with their key groups
    funke stop JOB

Files of JSON lines such as {"user": "ann", "page": "/cart"} are moved into --input (written
elsewhere, then renamed in). Each batch writes the sessions it closed as Parquet into --output.
"""

from __future__ import annotations

import argparse

from funke import ExecutionEnvironment, JobGraph
from funke.state import KeyedProcessFunction, ListState, MapState, ValueState


class Sessions(KeyedProcessFunction):
    """One session per user: clicks, distinct pages in order, clicks per page."""

    def __init__(self, gap_ms: int, ttl: str):
        self.gap_ms = gap_ms
        # each with a TTL: a session whose timer never fires (deleted by a later version, say) is forgotten
        self.state = (ValueState("started", "bigint", ttl=ttl), ValueState("clicks", "bigint", ttl=ttl),
                      ListState("pages", "string", ttl=ttl), MapState("per_page", "string", "bigint", ttl=ttl))

    def process(self, user, rows, ctx):
        s, now = ctx.state, ctx.current_processing_time()
        if s.started.value() is None:
            s.started.update(now)
        s.clicks.update((s.clicks.value() or 0) + len(rows))
        for row in rows:
            if not s.per_page.contains(row.page):
                s.pages.add(row.page)
            s.per_page.put(row.page, s.per_page.get(row.page, 0) + 1)
        timers = ctx.timer_service()
        for t in timers.processing_time_timers():  # one timer per session: the latest click's
            timers.delete_processing_time_timer(t)
        timers.register_processing_time_timer(now + self.gap_ms)

    def on_timer(self, user, timestamp, ctx):
        s = ctx.state
        top = max(s.per_page.items(), key=lambda item: item[1])[0] if not s.per_page.is_empty() else None
        yield (user, s.started.value(), timestamp, s.clicks.value(), " ".join(s.pages.get()), top)
        for handle in (s.started, s.clicks, s.pages, s.per_page):
            handle.clear()  # nothing left and no timer: the user leaves the state


def build(args: list[str]) -> JobGraph:
    parser = argparse.ArgumentParser(prog="sessions", description="Sessions per user of arriving click events.")
    parser.add_argument("--input", required=True, help="the directory JSON-lines click files arrive in")
    parser.add_argument("--output", help="directory the closed sessions go to, as Parquet; printed when absent")
    parser.add_argument("--gap", type=int, default=30_000, help="ms without a click that close a session")
    parser.add_argument("--ttl", default="1 h", help="how long an untouched session's state is kept at most")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory (where the sessions are kept)")
    parser.add_argument("--parallelism", type=int, default=2)
    opts = parser.parse_args(args)

    env = ExecutionEnvironment("sessions", parallelism=opts.parallelism)
    sessions = (
        env.read_stream.json_lines(opts.input, schema="user string, page string")
        .key_by("user")
        .process(Sessions(opts.gap, opts.ttl),
                 schema="user string, started bigint, closed bigint, clicks bigint, pages string, top_page string")
    )
    if opts.output:
        sessions.write_parquet(opts.output)
    else:
        sessions.print()
    env.set_trigger("1 s")
    if opts.checkpoint:
        env.set_checkpoint_location(opts.checkpoint)
    env.set_restart_strategy("fixed-delay", attempts=10, delay="1 s")
    return env.build()
