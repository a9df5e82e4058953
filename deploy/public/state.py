"""Keyed process functions and the state they declare (Flink's KeyedProcessFunction with
ValueState, ListState and MapState; Structured Streaming's transformWithState):

    from funke.state import KeyedProcessFunction, ValueState

    class Sessions(KeyedProcessFunction):
        state = (ValueState("clicks", "bigint", ttl="1 h"),)

        def process(self, key, rows, ctx):
            ctx.state.clicks.update((ctx.state.clicks.value() or 0) + len(rows))
            ...

    events.key_by("user").process(Sessions(), schema="user string, clicks bigint")

The documentation's Keyed state page (docs/streaming/keyed-state.md) says what the context
offers: timers, processing time, the watermark.
"""

from funke.common.api.state import KeyedProcessFunction, ListState, MapState, ValueState

__all__ = ["KeyedProcessFunction", "ListState", "MapState", "ValueState"]
