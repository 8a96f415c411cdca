"""The ventilator and the sink dying or stalling: each is restarted in place, every request gets
exactly one reply, clients' retries lose nothing, and idle clients keep working."""
import os
import re
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest
import zmq

from conftest import (FAST_HEARTBEATS, FAULTS, free_port, random_texts, raw_push, raw_sub, running_server, sink_pid,
                      wait_for)
from encoder_client import ConnectionLostError
from encoder_client.protocol import BUSY, decode_reply

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def server(small_queue_server):
    return small_queue_server


@pytest.mark.parametrize("victim", ["sink", "ventilator"])
def test_kill_9_of_the_sink_or_ventilator_restarts_it_in_place_and_retries_lose_nothing(tiny_model, tmp_path,
                                                                                       victim):
    """Clients with timeout=None and retries keep encoding while the process is killed: every
    request completes with the right rows, none hangs, and the server keeps its ports."""
    batches = [random_texts(200, seed=seed, min_words=10) for seed in range(4)]
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path) as server:
        with server.client() as client:
            expected = [client.encode(batch) for batch in batches]
        pid = int(re.findall(rf"{victim} started \(pid (\d+)\)", server.log)[-1])
        failures, done, spans = [], [], []

        def encode_for_a_while():
            with server.client(timeout=None) as client:
                for round_ in range(30):
                    index = round_ % len(batches)
                    started = time.monotonic()
                    try:
                        rows = client.encode(batches[index], retries=3)
                    except Exception as error:  # noqa: BLE001 - any failure fails the test below
                        failures.append(repr(error))
                        return
                    spans.append((started, time.monotonic()))
                    np.testing.assert_allclose(rows, expected[index], rtol=1e-5, atol=1e-6)
                    done.append(index)

        threads = [threading.Thread(target=encode_for_a_while) for _ in range(3)]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(done) >= 6)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a client hung"
        assert failures == [] and len(done) == 90
        assert server.process.poll() is None and f"{victim} exited unexpectedly" in server.log
        assert any(started < killed < finished for started, finished in spans), "no request was in flight"
        seconds = [finished - started for started, finished in spans]
        print(f"kill -9 of the {victim}: the slowest request took {max(seconds):.2f}s, the median "
              f"{np.median(seconds):.2f}s")


def test_every_request_gets_exactly_one_reply_while_the_sink_is_stopped(server):
    """30,000 one-text requests while the sink is stopped: more than the pending-texts limit and
    more replies than the ventilator keeps for the sink. Each still gets exactly one reply, a
    result or an error, once the sink is back: the ventilator stops reading requests instead of
    dropping the replies that refuse them. It once dropped 5,224 of them."""
    count, identity = 30_000, b"burst"
    sub, push = raw_sub(server, identity + b"\0"), raw_push(server, {zmq.SNDTIMEO: 120_000})
    sink = sink_pid(server)
    os.kill(sink, signal.SIGSTOP)
    sent = []

    def send_all():
        for req_id in range(count):
            push.send_multipart([identity, b'["one text"]', b"%d" % req_id, b"1"])
            sent.append(req_id)

    try:
        sender = threading.Thread(target=send_all)
        sender.start()
        time.sleep(8)
    finally:
        os.kill(sink, signal.SIGCONT)
    sender.join(120)
    assert len(sent) == count
    replies = {}
    while len(replies) < count and sub.poll(20_000):
        reply = decode_reply(sub.recv_multipart())
        assert reply.req_id not in replies, f"request {reply.req_id} got a second reply"
        replies[reply.req_id] = reply
    assert len(replies) == count, f"{count - len(replies)} requests got no reply"
    assert not sub.poll(1000), "a reply came twice"
    codes = Counter("result" if reply.array is not None else reply.code for reply in replies.values())
    assert set(codes) <= {"result", BUSY} and codes["result"] > 0, codes
    with server.client() as client:
        assert client.encode(["still serving"]).shape == (1, 32)


def test_a_stalled_ventilator_loses_no_worker(tiny_model, tmp_path):
    """The ventilator stopped for more than twice the heartbeat window (1.25 s here): its workers
    hear no heartbeat and connect again, and it hears none from them. Neither is a death: no worker
    is killed and no job counts as poison."""
    with running_server(tiny_model, "--num-worker", "2", tmp_path=tmp_path, env=FAST_HEARTBEATS) as server:
        texts = ["some text to encode"] * 50
        with server.client() as client:
            expected = client.encode(texts)
            ventilator = int(re.findall(r"ventilator started \(pid (\d+)\)", server.log)[-1])
            results = []
            sender = threading.Thread(target=lambda: results.append(client.encode(texts)))
            os.kill(ventilator, signal.SIGSTOP)
            try:
                sender.start()
                time.sleep(3)
            finally:
                os.kill(ventilator, signal.SIGCONT)
            sender.join(60)
            np.testing.assert_allclose(results[0], expected, atol=1e-6)
            time.sleep(2)
            status = client.server_status
        assert status["worker_restarts"] == 0 and status["workers_alive"] == 2, server.log
        assert "stopped sending heartbeats" not in server.log and "crash twice" not in server.log, server.log
        assert "no heartbeat from the ventilator" in server.log, "the stall was too short to test anything"


def test_idle_client_keeps_working_across_a_server_restart(tiny_model, tmp_path):
    ports = (free_port(), free_port())
    texts = random_texts(20, seed=5)
    with running_server(tiny_model, tmp_path=tmp_path / "a", ports=ports) as server:
        client = server.client(timeout=30)
        before = client.encode(texts)
    with running_server(tiny_model, tmp_path=tmp_path / "b", ports=ports):
        with client:
            np.testing.assert_allclose(client.encode(texts), before, rtol=1e-5, atol=1e-6)


def test_in_flight_request_fails_fast_on_restart_and_a_retry_succeeds(tiny_model, tmp_path):
    ports = (free_port(), free_port())
    with running_server(tiny_model, "--drain-timeout", "0.5", tmp_path=tmp_path / "a", ports=ports,
                        env=FAULTS) as server:
        client = server.client(timeout=20)
        client.encode(["!sleep 4", "held up"], blocking=False)
        wait_for(lambda: server.status()["in_flight_requests"] == 1, timeout=10)
        started = time.monotonic()
        server.stop()
        with pytest.raises(ConnectionLostError):
            client.fetch_all()
        assert time.monotonic() - started < 20
        assert "gave up waiting for 1 in-flight requests" in server.log, server.log
    with running_server(tiny_model, tmp_path=tmp_path / "b", ports=ports):
        with client:
            assert client.encode(["back again"], retries=3).shape == (1, 32)
