"""Hostile input at the public port, graceful stop, and start-up errors: real processes only."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from conftest import free_port, random_texts, running_server

pytestmark = pytest.mark.timeout(300)


def _hostile_frame_sets(identity):
    return [
        ("wrong frame count", [identity, b'["a"]']),
        ("bad JSON", [identity, b'["unclosed', b"1", b"1"]),
        ("not a list of strings", [identity, b'{"a": 1}', b"2", b"1"]),
        ("list with a number", [identity, b'["ok", 5]', b"3", b"2"]),
        ("non-numeric id", [identity, b'["ok"]', b"abc", b"1"]),
        ("lying msg_len", [identity, b'["ok", "fine"]', b"5", b"7"]),
        ("1 MB binary junk", [identity, os.urandom(1 << 20), b"6", b"1"]),
        ("empty string", [identity, b'[""]', b"7", b"1"]),
        ("options not an object", [identity, b'["ok"]', b"8", b"1", b"[1, 2]"]),
    ]


def test_hostile_frames_get_error_replies_and_others_never_notice(tiny_server):
    context = zmq.Context.instance()
    identity = b"hostile-peer"
    sender = context.socket(zmq.PUSH)
    receiver = context.socket(zmq.SUB)
    receiver.setsockopt(zmq.SUBSCRIBE, identity + b"\0")
    for sock, port in ((sender, tiny_server.port), (receiver, tiny_server.port_out)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{port}")
    with tiny_server.client() as bystander:
        stream = iter(bystander.encode_async(iter([random_texts(40, seed=i) for i in range(20)])))
        first = next(stream)  # a well-behaved client is mid-stream while the junk arrives
        receiver.poll(500)  # let the subscription settle (the frames below are not retried)
        cases = _hostile_frame_sets(identity)
        for _, frames in cases:
            sender.send_multipart(frames)
        sender.send_multipart([b"x" * 5000, b"[]", b"1", b"0"])  # unreadable identity: logged, dropped
        errors = []
        while receiver.poll(5000) and len(errors) < len(cases):
            frames = receiver.recv_multipart()
            assert frames[0] == identity + b"\0"
            reply = json.loads(frames[1])
            assert reply["code"] == "bad_request", reply
            errors.append(reply["error"])
        rest = list(stream)
        big_text = bystander.encode(["the cat " * 25000])  # a 200 kB text is truncated, not refused
        assert bystander.server_status["workers_alive"] == 2
    assert len(errors) == len(cases), errors
    assert all(error.startswith("bad request") for error in errors)
    joined = " | ".join(errors)
    for fragment in ("4 or 5 frames", "not valid JSON", "must be a list", "texts[1]", "req_id",
                     "msg_len is 7", "texts[0]", "options"):
        assert fragment in joined
    assert first.shape == (40, 32) and len(rest) == 19 and big_text.shape == (1, 32)
    sender.close()
    receiver.close()


def test_graceful_stop_finishes_in_flight_requests(tiny_model, tmp_path):
    texts = random_texts(2000, seed=8, min_words=20, max_words=40)
    with running_server(tiny_model, tmp_path=tmp_path) as server:
        with server.client() as client:
            expected_first = client.encode(texts[:3])
            client.encode(texts, blocking=False)
            stopper = subprocess.run([sys.executable, "-m", "encoder_server.cli", "stop", "--port", str(server.port),
                                      "--port-out", str(server.port_out)], capture_output=True, text=True,
                                     timeout=120)
            result = client.fetch_all(concat=True)
        assert stopper.returncode == 0, stopper.stderr
        assert server.process.wait(30) == 0
    assert result.shape == (2000, 32)
    np.testing.assert_allclose(result[:3], expected_first, atol=1e-6)


def test_sigint_stops_cleanly_and_refuses_nothing_in_flight(tiny_model, tmp_path):
    texts = random_texts(1500, seed=9, min_words=20, max_words=40)
    with running_server(tiny_model, tmp_path=tmp_path) as server:
        with server.client() as client:
            client.encode(texts, blocking=False)
            threading.Timer(0.3, lambda: os.killpg(server.process.pid, signal.SIGINT)).start()
            result = client.fetch_all(concat=True)
        assert server.process.wait(30) == 0
        assert "Traceback" not in server.log
    assert result.shape == (1500, 32)


def _start(*flags):
    return subprocess.run([sys.executable, "-m", "encoder_server.cli", "start", *flags],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("flags, message", [
    (["--model", "/nonexistent/model"], "no such folder"),
    (["--model", "/tmp"], "no config.json"),
    (["--model", "no-such-org/no-such-model"], "not in the Hugging Face cache"),
    (["--max-seq-len", "100000"], "above the model's limit"),
    (["--pooling-layer", "9"], "--pooling-layer 9"),
    (["--pooling-strategy", "cls", "--mask-cls-sep"], "--mask-cls-sep"),
    (["--fp16"], "--fp16 needs --device cuda"),
    (["--authorized-clients", "/tmp"], "--authorized-clients needs --server-key"),
    (["--server-key", "/nonexistent/server.key_secret"], "--server-key /nonexistent/server.key_secret"),
    (["--max-pending-texts", "0"], "--max-pending-texts must be at least 1"),
    (["--host", "0.0.0.0", "--worker-port", "5999"], "--worker-port on 0.0.0.0 would let anyone who reaches it read"),
])
def test_start_up_errors_are_one_clear_line(tiny_model, flags, message):
    if "--model" not in flags:
        flags = ["--model", str(tiny_model), *flags]
    finished = _start(*flags, "--port", str(free_port()), "--port-out", str(free_port()))
    assert finished.returncode == 2
    assert message in finished.stderr and "Traceback" not in finished.stderr
    assert len(finished.stderr.strip().splitlines()) == 1


def test_port_in_use_is_a_clear_error(tiny_model):
    with zmq.Context.instance().socket(zmq.PULL) as taken:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        finished = _start("--model", str(tiny_model), "--port", str(port), "--port-out", str(free_port()))
    assert finished.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in finished.stderr and "Traceback" not in finished.stderr


def test_bad_flag_is_rejected_without_traceback():
    finished = _start("--num-worker", "many")
    assert finished.returncode == 2 and "invalid int value" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_status_command_reports_ready(tiny_server):
    finished = subprocess.run([sys.executable, "-m", "encoder_server.cli", "status", "--port", str(tiny_server.port),
                               "--port-out", str(tiny_server.port_out)], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout)["workers_alive"] == 2


def test_status_command_fails_when_no_server():
    finished = subprocess.run([sys.executable, "-m", "encoder_server.cli", "status", "--port", str(free_port()),
                               "--port-out", str(free_port()), "--timeout", "1"],
                              capture_output=True, text=True, timeout=60)
    assert finished.returncode == 1 and "no answer" in finished.stderr


def test_malformed_internal_messages_on_an_open_worker_port_are_dropped(tiny_model, tmp_path):
    """A peer on the worker ports (open without CURVE on loopback) sends what no worker would: the
    ventilator and the sink log and drop it, nothing restarts, clients never notice, and a reply
    it tries to publish never reaches the client it names. Each case below once ended the
    ventilator or the sink, and the server exited 1."""
    texts = random_texts(60, seed=31)
    jobs_port = free_port(consecutive=2)
    with running_server(tiny_model, "--num-worker", "1", "--worker-port", str(jobs_port),
                        tmp_path=tmp_path) as server:
        with server.client() as client:
            expected = client.encode(texts)
        context = zmq.Context()
        try:
            victim = context.socket(zmq.SUB)
            victim.setsockopt(zmq.SUBSCRIBE, b"victim\0")
            victim.connect(f"tcp://127.0.0.1:{server.port_out}")
            results = context.socket(zmq.PUSH)
            results.connect(f"tcp://127.0.0.1:{jobs_port + 1}")
            for number, frames in enumerate((
                    [b"HEARTBEAT", b'{"histograms": [], "tokens": {}, "passes": 1}'], [b"HEARTBEAT", b"[1]"],
                    [b"HEARTBEAT", b'{"histograms": 5, "tokens": {}, "passes": 1, "truncated": 0}'],
                    [b"DROPPED"], [b"DROPPED", b"not a number"], [b"READY", b"{"], [b"JOB"], [b"WHAT"],
                    [b"\xff" * 300])):
                # a peer of its own for each: one that misbehaved is ignored for a while after
                peer = context.socket(zmq.DEALER)
                peer.setsockopt(zmq.ROUTING_ID, b"peer/worker-%d:1" % number)
                peer.connect(f"tcp://127.0.0.1:{jobs_port}")
                peer.send_multipart([b"READY", json.dumps({"pid": 1, "host": "peer", "remote": True}).encode()])
                peer.send_multipart(frames)
            for frames in ([b"PART", b"{}", b"\x00" * 8], [b"PART", b'{"seq": 1, "shape": [9]}', b""],
                           [b"PART", b"not json", b"\x00" * 8],
                           [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 1], "dtype": "object"}',
                            b"\x00" * 8],
                           [b"PUBLISH", b"victim\0", b'{"error": "forged"}', b"", b"1"], [b"FORGET", b"1", b"x", b""],
                           [b"DONE"], [b"REGISTER", b"x", b"[]"], [b"PUBLISH"], [b"\x00"]):
                results.send_multipart(frames)
            time.sleep(1.0)
            assert not victim.poll(500), "a peer on the worker port published to a client"
        finally:
            context.destroy(linger=0)
        with server.client() as client:
            np.testing.assert_allclose(client.encode(texts), expected, rtol=1e-4, atol=1e-5)
            status = client.server_status
        assert status["worker_restarts"] == 0 and server.process.poll() is None
    log = server.log
    for words in ("malformed HEARTBEAT", "malformed DROPPED", "malformed PART", "sent a malformed message",
                  "dropped a Publish message from a worker, which it may not send"):
        assert words in log, words


def test_keygen_keeps_an_existing_pair(tmp_path):
    """docker/compose.yaml runs keygen at every start: the keys its peers hold must survive it."""
    def keygen():
        return subprocess.run([sys.executable, "-m", "encoder_server.cli", "keygen", str(tmp_path)],
                               capture_output=True, text=True, timeout=60)

    first = keygen()
    secret = (tmp_path / "server.key_secret").read_bytes()
    second = keygen()
    assert first.returncode == second.returncode == 0 and "kept" in second.stdout and "kept" not in first.stdout
    assert (tmp_path / "server.key_secret").read_bytes() == secret
    (tmp_path / "server.key_secret").write_text("damaged")
    damaged = keygen()
    assert damaged.returncode == 2 and "error" in damaged.stderr and "Traceback" not in damaged.stderr
