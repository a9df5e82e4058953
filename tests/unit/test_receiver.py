"""A receiver on the TaskManager (taskmanager/receiver.py), against a real socket: lines stored as
numbered blocks before they count, never overwritten, numbering going on after a restart; a
connection lost is made again; the rate limit holds; a stop stores what was read."""

from __future__ import annotations

import os
import socket
import threading
import time

from funke.common.streaming.sources import parse_block_file_name, stored_blocks
from funke.taskmanager.receiver import BlockStore, RateLimiter, SocketReceiver


def read_blocks(directory) -> list[str]:
    blocks = stored_blocks(os.listdir(directory))
    return [line for seq in sorted(blocks)
            for line in open(os.path.join(directory, blocks[seq]), encoding="utf-8").read().splitlines()]


def serve(payloads: list[bytes]) -> tuple[int, threading.Thread]:
    """A server that accepts len(payloads) connections one after the other, sends each its
    payload, and closes it."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def run() -> None:
        with server:
            for payload in payloads:
                conn, _ = server.accept()
                with conn:
                    conn.sendall(payload)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_blocks_are_numbered_written_whole_never_overwritten_and_numbering_goes_on_after_a_restart(tmp_path):
    store = BlockStore(str(tmp_path))
    assert store.store(["a", "b"]) == "000000000000.block"
    (tmp_path / "000000000001.block").write_text("someone else's\n")  # another writer's block
    assert store.store(["c"]) == "000000000002.block"
    again = BlockStore(str(tmp_path))  # a receiver started again
    assert again.store(["d"]) == "000000000003.block"
    assert sorted(os.listdir(tmp_path)) == [
        "000000000000.block", "000000000001.block", "000000000002.block", "000000000003.block"]  # no temporary left
    assert (tmp_path / "000000000000.block").read_text() == "a\nb\n"
    assert (tmp_path / "000000000001.block").read_text() == "someone else's\n"


def test_a_receiver_stores_every_line_it_reads_and_connects_again_when_the_server_closes(tmp_path):
    first = b"".join(f"one {i}\r\n".encode() for i in range(50)) + "ünïcode\n".encode() + b"no newline at the end"
    second = b"".join(f"two {i}\n".encode() for i in range(30))
    port, server = serve([first, second])
    receiver = SocketReceiver("127.0.0.1", port, BlockStore(str(tmp_path)), block_interval_s=0.05, name="r")
    receiver.start()
    expected = [f"one {i}" for i in range(50)] + ["ünïcode", "no newline at the end"] + [f"two {i}" for i in range(30)]
    assert wait_until(lambda: read_blocks(tmp_path) == expected), read_blocks(tmp_path)[-3:]
    assert receiver.connections == 2 and receiver.error is None
    receiver.stop()
    assert not receiver.alive
    assert sorted(parse_block_file_name(n) for n in os.listdir(tmp_path)) == list(range(len(os.listdir(tmp_path))))


def test_a_receiver_takes_no_more_than_its_rate_and_a_stop_stores_what_it_read(tmp_path):
    port, server = serve([b"".join(f"{i}\n".encode() for i in range(400))])
    receiver = SocketReceiver("127.0.0.1", port, BlockStore(str(tmp_path)), block_interval_s=0.05,
                              max_rate=100, name="slow")
    started = time.monotonic()
    receiver.start()
    time.sleep(1.0)
    taken = len(read_blocks(tmp_path))
    receiver.stop()
    elapsed = time.monotonic() - started
    stored = read_blocks(tmp_path)
    assert taken <= 100 * elapsed + 100 + 64, taken  # a second's worth and a read's worth of burst
    assert stored == [str(i) for i in range(len(stored))] and len(stored) >= taken


def test_a_server_that_is_not_there_is_tried_again_until_it_is(tmp_path):
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    receiver = SocketReceiver("127.0.0.1", port, BlockStore(str(tmp_path)), block_interval_s=0.05, name="early")
    receiver.start()
    time.sleep(0.3)
    assert receiver.connections == 0 and receiver.alive
    server = socket.create_server(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.sendall(b"late\n")
    conn.close()
    server.close()
    assert wait_until(lambda: read_blocks(tmp_path) == ["late"])
    receiver.stop()


def test_the_rate_limiter_lets_a_second_through_then_one_record_at_a_time():
    now = [0.0]
    limiter = RateLimiter(10, clock=lambda: now[0])
    assert limiter.take(15) == 10  # a second's worth at once, no more
    assert limiter.take(5) == 0 and limiter.wait_for_one() == 0.1
    now[0] = 0.35
    assert limiter.take(5) == 3  # 3.5 records' worth of time: 3 taken, half of one kept
    now[0] = 10.0
    assert limiter.take(100) == 10  # a long pause earns no more than a second's worth
    limiter.set_rate(2)  # lowered: what was allowed at the old rate does not carry over
    now[0] = 10.5
    assert limiter.take(100) == 1
    unlimited = RateLimiter(None)
    assert unlimited.take(10**9) == 10**9 and unlimited.wait_for_one() == 0


def test_a_receiver_under_a_rate_takes_lines_evenly_while_the_sender_offers_more(tmp_path):
    from funke.deploy.lineserver import LineServer

    server = LineServer(rate=400, make_line=lambda i: f"line {i}")
    receiver = SocketReceiver("127.0.0.1", server.port, BlockStore(str(tmp_path)), block_interval_s=0.1)
    receiver.set_rate(100.0)
    try:
        receiver.start()
        assert wait_until(lambda: receiver.connections == 1)
        counts = []
        for _ in range(4):
            time.sleep(0.5)
            counts.append(receiver.store.records)
    finally:
        receiver.stop()
        server.close()
    steps = [b - a for a, b in zip(counts, counts[1:])]
    # 50 lines every half second (a block's slack either way), not a burst and then nothing
    assert all(25 <= step <= 75 for step in steps), (counts, steps)
    assert server.sent > counts[-1] + 100  # the sender offered more, and was held back by TCP, not dropped
    assert read_blocks(tmp_path) == [f"line {i}" for i in range(receiver.store.records)]


def test_purged_blocks_keep_the_newest_number_so_a_restarted_receiver_never_goes_back(tmp_path):
    from funke.common.streaming.sources import ReceiverSource
    from funke.jobmanager.streaming import ReceiverPlanner

    store = BlockStore(str(tmp_path / "0"))
    for i in range(5):
        store.store([f"line {i}"])
    planner = ReceiverPlanner(str(tmp_path), ReceiverSource(1))
    assert planner.forget_before({"0": 3}) == 3  # blocks 0, 1 gone, 2 emptied
    assert sorted(os.listdir(tmp_path / "0")) == ["000000000002.block", "000000000003.block", "000000000004.block"]
    assert (tmp_path / "0" / "000000000002.block").read_text() == ""
    assert planner.plan({"0": 3}, 0, True, None).end == {"0": 5}
    assert planner.batch_files(planner.plan({"0": 3}, 0, True, None)) == ("0/000000000003.block", "0/000000000004.block")
    assert planner.forget_before({"0": 5}) == 3  # 2 (empty) and 3 gone, 4 emptied
    assert os.listdir(tmp_path / "0") == ["000000000004.block"]
    assert BlockStore(str(tmp_path / "0")).store(["after"]) == "000000000005.block"  # not 0
