"""Click events over event time: page views per minute, and each user's sessions, by the time the
clicks happened rather than the time they arrived; late clicks kept aside, never dropped
silently. Watermarks, tumbling and session windows, and late data (Structured Streaming's
withWatermark, window and session_window; Flink's side output of late data).

Run it on a cluster with:

    funke submit examples/clicks_over_event_time.py -- --input /tmp/clicks --output /tmp/out
    funke progress JOB          # each batch's event times, its watermark, its late rows
    funke state JOB             # the windows and sessions still open
    funke stop JOB

Files of JSON lines such as {"user": "ann", "page": "/cart", "ts": "2026-11-27T10:00:03Z"} are
moved into --input (written elsewhere, then renamed in). The watermark trails the latest click
time seen by --delay; a minute's page views are written once the watermark passes the minute's
end (append mode), a session once the watermark passes its last click plus --gap. A click for a
minute already written goes to <output>/late with the window it missed and the watermark.
"""

from __future__ import annotations

import argparse

from funke import ExecutionEnvironment, JobGraph


def build(args: list[str]) -> JobGraph:
    parser = argparse.ArgumentParser(prog="clicks_over_event_time",
                                     description="Page views per minute and user sessions by event time.")
    parser.add_argument("--input", required=True, help="the directory JSON-lines click files arrive in")
    parser.add_argument("--output", required=True, help="views/, sessions/ and late/ go under it, as Parquet")
    parser.add_argument("--delay", default="10 s", help="how far the watermark trails the latest click time")
    parser.add_argument("--window", default="1 min", help="the page-view windows' size")
    parser.add_argument("--gap", default="30 s", help="a session ends after this long without a click")
    parser.add_argument("--checkpoint", help="the query's checkpoint directory (where open windows are kept)")
    parser.add_argument("--parallelism", type=int, default=2)
    opts = parser.parse_args(args)

    env = ExecutionEnvironment("clicks over event time", parallelism=opts.parallelism)
    clicks = (env.read_stream.json_lines(opts.input, schema="user string, page string, ts timestamp")
              .with_watermark("ts", opts.delay))
    views = clicks.key_by("page").window("ts", opts.window).count()
    views.write_parquet(f"{opts.output}/views")
    views.late_data().write_parquet(f"{opts.output}/late")
    (clicks.key_by("user")
        .session_window("ts", opts.gap)
        .aggregate("count(1) AS clicks", "min(ts) AS first_click", "max(ts) AS last_click")
        .write_parquet(f"{opts.output}/sessions"))
    env.set_output_mode("append").set_trigger("1 s")
    if opts.checkpoint:
        env.set_checkpoint_location(opts.checkpoint)
    env.set_restart_strategy("fixed-delay", attempts=10, delay="1 s")
    return env.build()
