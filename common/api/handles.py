"""What every operator handle of the DataStream DSL has, and the handles sinks return.

`_OperatorHandle` holds the per-operator settings every stream and sink takes (`name`, `uid`,
`set_parallelism`, slot-sharing and co-location groups, chaining); `DataStream` (`datastream.py`)
and the sink handles below inherit them. A sink (`DataStream.print()`, `write_*`, `collect()`,
...) returns a `DataStreamSink`, or for `collect()` a `CollectSink`, whose `vertex_id` names where
the client fetches the rows.

`ExecutionEnvironment` in the annotations is `environment.py`'s; it is not imported here
(environment.py imports this module through `datastream.py`).
"""

from __future__ import annotations

from typing import Self

from funke.common import ids
from funke.common.api.arguments import _label, _non_empty_str, _positive_int
from funke.common.api.translate import Chaining, Transformation


UID_MAX_LENGTH = 128


class _OperatorHandle:
    """Per-operator settings, shared by streams and sinks. Each applies to the last operator
    the handle stands for and returns the handle, so settings chain after the call that
    created the operator."""

    __slots__ = ("_env", "_t")

    def __init__(self, env: ExecutionEnvironment, t: Transformation) -> None:
        self._env = env
        self._t = t

    def set_parallelism(self, parallelism: int) -> Self:
        self._t.parallelism = _positive_int(parallelism, "parallelism")
        return self

    def set_max_parallelism(self, max_parallelism: int) -> Self:
        """The number of key groups of keyed operators, and the upper bound for rescaling."""
        self._t.max_parallelism = _positive_int(max_parallelism, "max parallelism")
        return self

    def name(self, name: str) -> Self:
        """The name shown in the vertex name, the dashboard and `funke status`."""
        self._t.name = _non_empty_str(name, "name")
        return self

    def uid(self, uid: str) -> Self:
        """A stable id, unique within the job; it becomes the JobVertex id when this operator
        heads a chain (otherwise vertex ids are generated from the head operator's kind)."""
        # At most 128 characters, so that the ids derived from it (data sets "<uid>.out0", edges
        # "<uid>-><uid>") stay within the id limits.
        self._env._register_uid(self._t, ids.require_path_id(_non_empty_str(uid, "uid"), "uid", UID_MAX_LENGTH))
        return self

    def slot_sharing_group(self, group: str) -> Self:
        """Operators in different groups never share a slot (and so never chain). Without a
        group an operator inherits its inputs' group when they all agree, else "default"."""
        self._t.slot_sharing_group = _label(group, "slot-sharing group")
        return self

    def co_location_group(self, group: str) -> Self:
        """Subtask i of every operator in the group runs in the same slot."""
        self._t.co_location_group = _label(group, "co-location group")
        return self

    def disable_chaining(self) -> Self:
        """Chain this operator to neither its predecessor nor its successor."""
        self._t.chaining = Chaining.NEVER
        return self

    def start_new_chain(self) -> Self:
        """Begin a new chain at this operator; its successors may still chain to it."""
        if self._t.chaining is not Chaining.NEVER:
            self._t.chaining = Chaining.HEAD
        return self

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._t.name!r}>"



class DataStreamSink(_OperatorHandle):
    """The end of a pipeline; takes the same per-operator settings as a stream."""

    __slots__ = ()


class CollectSink(DataStreamSink):
    """The handle `collect()` returns: the client fetches the rows committed for `vertex_id`."""

    __slots__ = ()

    @property
    def vertex_id(self) -> str:
        """The id of the JobVertex this sink runs in, in the graph the last `build()` returned
        (or would return now, before the first build). The sink is often chained behind other
        operators, so this is the chain's id, not necessarily one derived from the sink."""
        return self._env._vertex_id_of(self._t)
