"""Signals to the server's process group and to the supervisor: a graceful stop finishes what is in
flight, kill -9 leaves no orphan, and a restart on the same ports succeeds at once."""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import free_port, group_alive, random_texts, running_server, wait_for
from encoder_server.server.supervisor import RUN_DIR_PREFIX

# what the ventilator logs when it starts draining with requests in flight (the last one whose reply
# a client has may still count: its DONE can reach the ventilator after the client has its reply)
IN_FLIGHT_AT_THE_STOP = r"draining: [1-9]\d* requests in flight"

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_a_signal_to_the_whole_group_drains_in_flight_requests(tiny_model, tmp_path, signum):
    """systemd's KillMode, `kill -- -PGID`, and Ctrl-C in a terminal: children ignore the group's
    signal and the supervisor drains; the client's request in flight (a request of some seconds, once
    the server reports it; the drain may take longer than its default 10 s on a loaded machine)
    completes, and nothing is refused or logged as a crash."""
    texts = random_texts(15_000, seed=5, min_words=20, max_words=40)
    with running_server(tiny_model, "--num-worker", "1", "--drain-timeout", "60", tmp_path=tmp_path) as server:
        with server.client() as client:
            client.encode(texts, blocking=False)
            wait_for(lambda: server.status()["in_flight_requests"] == 1, timeout=30)
            os.killpg(server.process.pid, signum)
            result = client.fetch_all(concat=True)
        assert server.process.wait(30) == 0
        assert "Traceback" not in server.log and re.search(IN_FLIGHT_AT_THE_STOP, server.log)
    assert result.shape == (15_000, 32)


def test_kill_9_of_the_supervisor_takes_its_children_and_a_restart_succeeds_at_once(tiny_model, tmp_path):
    ports = (free_port(), free_port())
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path / "a", ports=ports) as first:
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
        started = time.monotonic()
        wait_for(lambda: not group_alive(first.process.pid), timeout=5)
        children_gone_s = time.monotonic() - started
        stale = [p for p in first.tmpdir.iterdir() if p.name.startswith(RUN_DIR_PREFIX)]
        assert stale, "expected the killed server's ipc folder to be left behind"
        # the same ports and TMPDIR at once: the next server starts and removes the stale folder
        with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path / "a", ports=ports) as second:
            with second.client() as client:
                assert client.encode(["back"]).shape == (1, 32)
            assert not any(path.exists() for path in stale)
    assert children_gone_s < 3


def test_graceful_stop_finishes_in_flight_requests(tiny_model, tmp_path):
    """TERMINATION behind a request on the same connection, so that the request is surely in flight
    when it is heard (from another connection, 2,000 texts had been served before the `stop`
    command's interpreter had started, and nothing drained)."""
    texts = random_texts(2000, seed=8, min_words=20, max_words=40)
    with running_server(tiny_model, tmp_path=tmp_path) as server:
        with server.client() as client:
            expected_first = client.encode(texts[:3])
            client.encode(texts, blocking=False)
            assert client.shutdown_server() == {"terminating": True}
            result = client.fetch_all(concat=True)
        assert server.process.wait(30) == 0
        assert re.search(IN_FLIGHT_AT_THE_STOP, server.log)
    assert result.shape == (2000, 32)
    np.testing.assert_allclose(result[:3], expected_first, atol=1e-6)


def test_encoder_server_stop_stops_a_server(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path) as server:
        stopper = subprocess.run([sys.executable, "-m", "encoder_server.cli", "stop", "--port", str(server.port),
                                  "--port-out", str(server.port_out)], capture_output=True, text=True, timeout=120)
        assert stopper.returncode == 0, stopper.stderr
        assert server.process.wait(30) == 0
        assert "TERMINATION received from 127.0.0.1" in server.log


def test_a_stopping_sink_hands_a_slow_reader_the_rest_of_its_streamed_result(tiny_model, tmp_path):
    """A result of 16 MB streamed in 1 MB chunks, far more than the kernel's socket buffers hold,
    whose reader is slow when the server is told to stop: the ventilator has nothing in flight and
    stops at once, and the sink keeps offering the chunks it holds to their reader before it exits."""
    import json

    import zmq

    from encoder_client.protocol import CHUNK_BYTES

    identity = b"slow-at-the-stop"
    texts = random_texts(2000, seed=8, min_words=70, max_words=80)  # 64 tokens x 32 floats each: 8 KB a text
    with running_server(tiny_model, "--num-worker", "1", "--pooling-strategy", "none", tmp_path=tmp_path) as server:
        context = zmq.Context.instance()
        reader = context.socket(zmq.SUB)
        reader.setsockopt(zmq.RCVHWM, 1)
        reader.setsockopt(zmq.RCVBUF, 4096)
        reader.setsockopt(zmq.SUBSCRIBE, identity + b"\0")
        reader.connect(f"tcp://127.0.0.1:{server.port_out}")
        sender = context.socket(zmq.PUSH)
        sender.connect(f"tcp://127.0.0.1:{server.port}")
        time.sleep(0.5)  # let the subscription reach the sink
        sender.send_multipart([identity, json.dumps(texts).encode(), b"1", b"%d" % len(texts), b'{"v": 2}'])
        assert reader.poll(60_000), "no first chunk"
        first = reader.recv_multipart()
        size = int(np.prod(json.loads(first[1])["shape"])) * 4
        os.killpg(server.process.pid, signal.SIGTERM)
        received = len(first[2])
        while received < size and reader.poll(5_000):
            received += len(reader.recv_multipart()[2])
            time.sleep(0.005)
        for sock in (reader, sender):
            sock.close(linger=0)
        assert server.process.wait(30) == 0
    assert size > 10 * CHUNK_BYTES and received == size
