"""A socket receiver source's TaskManager side beside its reader (`operators/sources.py`'s
source.socket): the receiver that runs beside each of its tasks and stores what it reads as
blocks in the query's checkpoint (`funke.taskmanager.receiver`)."""

from __future__ import annotations

from typing import Any, Mapping

from funke.common.streaming.sources import receiver_blocks_dir
from funke.taskmanager.receiver import BlockStore, SocketReceiver


def socket_receiver(config: Mapping[str, Any], checkpoint: str, vertex_id: str, subtask: int,
                    name: str) -> SocketReceiver:
    store = BlockStore(receiver_blocks_dir(checkpoint, vertex_id, subtask))
    max_rate = config.get("max_rate")
    return SocketReceiver(str(config["host"]), int(config["port"]), store,
                          block_interval_s=int(config.get("block_interval_ms", 200)) / 1000,
                          max_rate=float(max_rate) if max_rate is not None else None, name=name)
