"""The TaskManager side's registry of streaming sources, by operator kind: how a task reads a
batch's range of the source (a function as `operators.OPERATORS` holds), and for a receiver
source, the receiver that runs beside the task. The task (`funke.taskmanager.task`) looks its
head operator up here; kinds that are not stream sources are `operators.OPERATORS`'."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from funke.taskmanager.operators import OPERATORS
from funke.taskmanager.streaming import delta, jsonlines
from funke.taskmanager.streaming.receiver import socket_receiver


@dataclass(frozen=True, slots=True)
class TaskSource:
    read: Callable[..., Any]  # (RuntimeContext, OperatorSpec) -> DataFrame of the batch's range
    receiver: Callable[..., Any] | None = None  # (config, checkpoint, vertex, subtask, name) -> a receiver


TASK_SOURCES: dict[str, TaskSource] = {
    "source.rate": TaskSource(OPERATORS["source.rate"]),
    "source.stream.text": TaskSource(OPERATORS["source.stream.text"]),
    "source.stream.csv": TaskSource(OPERATORS["source.stream.csv"]),
    "source.stream.json": TaskSource(OPERATORS["source.stream.json"]),
    "source.stream.parquet": TaskSource(OPERATORS["source.stream.parquet"]),
    "source.socket": TaskSource(OPERATORS["source.socket"], socket_receiver),
    "source.redis": TaskSource(OPERATORS["source.redis"]),
    "source.kafka": TaskSource(OPERATORS["source.kafka"]),
    "source.stream.jsonlines": TaskSource(jsonlines.read),
    "source.stream.delta": TaskSource(delta.read),
}


def operator(kind: str) -> Callable[..., Any] | None:
    """The function that runs an operator of this kind on this TaskManager (None: unknown)."""
    source = TASK_SOURCES.get(kind)
    return source.read if source is not None else OPERATORS.get(kind)
