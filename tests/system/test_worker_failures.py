"""Workers that die, hang, misbehave or lie: their jobs are done by others, they are replaced or
set aside, and no request is lost or computed twice. Faults come from the test-only hook in
encoder_server.server.fault_injection."""
import json
import os
import signal
import socket
import threading
import time

import numpy as np
import pytest
import zmq

from conftest import FAST_HEARTBEATS, FAULTS, free_port, random_texts, running_server, wait_for, workers_hold_jobs

from encoder_client import ServerError
from encoder_server.server.messages import INTERNAL_PROTOCOL

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("lanes", [1, 3])
def test_kill_9_worker_mid_request_loses_and_duplicates_nothing(tiny_model, tmp_path, lanes):
    """With several lanes, the killed process held several passes' jobs: all go to the other one."""
    texts = random_texts(5000, seed=21, min_words=5, max_words=30)
    # each holds the one tokenizing thread of the worker that takes it (the CPU's default): the first
    # worker is stuck on the first while the other takes every job up to the second, so for a while
    # both surely hold jobs
    texts[1500] = texts[4000] = "!sleep 2"
    with running_server(tiny_model, "--num-worker", "2", "--lanes", str(lanes), tmp_path=tmp_path,
                        env=FAULTS) as server:
        with server.client() as client, server.client() as watcher:
            undisturbed = client.encode(texts)
            client.encode(texts, blocking=False)
            wait_for(lambda: workers_hold_jobs(watcher.server_status))
            os.kill(server.worker_pids()[0], signal.SIGKILL)
            disturbed = client.fetch_all(concat=True)
        assert disturbed.shape == undisturbed.shape
        np.testing.assert_allclose(disturbed, undisturbed, rtol=1e-4, atol=1e-5)
        wait_for(lambda: server.status()["ready"])
        status = server.status()
        assert status["worker_restarts"] == 1 and status["jobs_redispatched"] >= 1
        assert status["workers_alive"] == 2


def test_worker_that_stops_beating_is_replaced(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "2", tmp_path=tmp_path, env=FAST_HEARTBEATS) as server:
        frozen = server.worker_pids()[0]
        os.kill(frozen, signal.SIGSTOP)  # alive to the OS, silent to the ventilator
        wait_for(lambda: server.status()["worker_restarts"] == 1, timeout=30)
        wait_for(lambda: server.status()["ready"])
        assert frozen not in server.worker_pids()
        with server.client() as client:
            assert client.encode(random_texts(50)).shape == (50, 32)


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
                    [b"DROPPED"], [b"DROPPED", b"not a number"], [b"READY", b"{"], [b"JOBS"], [b"WHAT"],
                    [b"\xff" * 300])):
                # a peer of its own for each: one that misbehaved is ignored for a while after
                peer = context.socket(zmq.DEALER)
                peer.setsockopt(zmq.ROUTING_ID, b"peer/worker-%d:1" % number)
                peer.connect(f"tcp://127.0.0.1:{jobs_port}")
                peer.send_multipart([b"READY", json.dumps({"pid": 1, "host": "peer", "remote": True,
                                                           "protocol": INTERNAL_PROTOCOL}).encode()])
                peer.send_multipart(frames)
            older = context.socket(zmq.DEALER)  # a worker of an older release: its READY names no protocol
            older.setsockopt(zmq.ROUTING_ID, b"older/worker-0:1")
            older.connect(f"tcp://127.0.0.1:{jobs_port}")
            older.send_multipart([b"READY", json.dumps({"pid": 1, "host": "older", "remote": True}).encode()])
            for frames in ([b"PARTS", b"[{}]", b"\x00" * 8], [b"PARTS", b'[{"seq": 1, "shape": [9]}]', b""],
                           [b"PARTS", b"not json", b"\x00" * 8],
                           [b"PARTS", b'[{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 1], "dtype": "object", '
                                      b'"bytes": 8}]', b"\x00" * 8],
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
        assert status["worker_restarts"] == 0 and status["workers_alive"] == 1 and server.process.poll() is None
    log = server.log
    for words in ("malformed HEARTBEAT", "malformed DROPPED", "malformed PARTS", "sent a malformed message",
                  "dropped a Publish message from a worker, which it may not send",
                  f"older/worker-0:1 speaks version None of the workers' protocol, this server {INTERNAL_PROTOCOL}"):
        assert words in log, words


def test_a_peer_on_the_worker_port_cannot_pass_for_a_local_worker_and_have_it_killed(tiny_model, tmp_path):
    """It says READY with this host's name and a local worker's pid, then misbehaves: it is given
    up, and the local worker lives on (the ventilator once took its word, and had that pid killed)."""
    jobs_port = free_port(consecutive=2)
    with running_server(tiny_model, "--num-worker", "1", "--worker-port", str(jobs_port),
                        tmp_path=tmp_path) as server:
        (local_pid,) = server.worker_pids()
        context = zmq.Context()
        try:
            impostor = context.socket(zmq.DEALER)
            impostor.connect(f"tcp://127.0.0.1:{jobs_port}")
            impostor.send_multipart([b"READY", json.dumps({"pid": local_pid, "host": socket.gethostname(),
                                                           "remote": False, "protocol": INTERNAL_PROTOCOL}).encode()])
            wait_for(lambda: server.status()["workers_alive"] == 2, timeout=20)
            impostor.send_multipart([b"HEARTBEAT", b"not json"])
            wait_for(lambda: server.status()["workers_alive"] == 1, timeout=20)
        finally:
            context.destroy(linger=0)
        time.sleep(1)
        assert server.worker_pids() == [local_pid] and server.status()["worker_restarts"] == 0
        with server.client() as client:
            assert client.encode(["still served"]).shape == (1, 32)
    assert "sent a malformed message" in server.log and "stopped sending heartbeats" not in server.log


class JunkWorker:
    """A peer on an open --worker-port that says READY, keeps beating, and answers every job with
    a part the sink cannot decode (its body does not fill its shape)."""

    def __init__(self, jobs_port):
        self.context = zmq.Context()
        self.jobs = self.context.socket(zmq.DEALER)
        self.jobs.setsockopt(zmq.ROUTING_ID, b"junk/worker-0:1")
        self.jobs.connect(f"tcp://127.0.0.1:{jobs_port}")
        self.parts = self.context.socket(zmq.PUSH)
        self.parts.connect(f"tcp://127.0.0.1:{jobs_port + 1}")
        self.received = 0
        self.ready = [b"READY", json.dumps({"pid": 1, "host": "junk", "remote": True,
                                            "protocol": INTERNAL_PROTOCOL}).encode()]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        self.jobs.send_multipart(self.ready)
        next_beat = 0.0
        while not self.stop.is_set():
            if time.monotonic() >= next_beat:
                self.jobs.send_multipart([b"HEARTBEAT"])
                next_beat = time.monotonic() + 0.5
            if not self.jobs.poll(50):
                continue
            frames = self.jobs.recv_multipart()
            if frames[0] == b"WHO":
                self.jobs.send_multipart(self.ready)
            elif frames[0] == b"JOBS":
                for job in json.loads(frames[1]):
                    self.received += 1
                    header = {"seq": job["seq"], "job_id": job["job_id"], "offset": job["offset"],
                              "shape": [len(job["texts"]), 32], "bytes": 8}
                    self.parts.send_multipart([b"PARTS", json.dumps([header]).encode(), b"\0" * 8])

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.context.destroy(linger=0)


def test_a_worker_that_answers_junk_is_set_aside_and_its_jobs_done_by_others(tiny_model, tmp_path):
    """Its jobs once went unanswered until each request's 30 s timeout, and it kept being dealt
    more. Now the sink names the job whose part it could not decode, the ventilator gives that
    job to another worker and keeps the sender out."""
    jobs_port = free_port(consecutive=2)
    texts = random_texts(600, seed=41)
    with running_server(tiny_model, "--num-worker", "1", "--worker-port", str(jobs_port), "--max-batch-size", "16",
                        tmp_path=tmp_path) as server:
        with server.client(timeout=20) as client:
            expected = client.encode(texts)
            with JunkWorker(jobs_port) as junk:
                wait_for(lambda: client.server_status["workers_alive"] == 2, timeout=20)
                started = time.monotonic()
                for _ in range(3):
                    np.testing.assert_allclose(client.encode(texts), expected, rtol=1e-4, atol=1e-5)
                assert client.encode(["a single text"]).shape == (1, 32)
                elapsed = time.monotonic() - started
                assert junk.received >= 1, "the junk worker was never dealt a job: this test shows nothing"
                assert junk.received <= 4 and client.server_status["workers_alive"] == 1
            status = client.server_status
        assert elapsed < 15 and status["jobs_redispatched"] >= 1
    assert "sent a part the sink could not use" in server.log


def test_a_job_that_makes_every_local_worker_send_junk_fails_its_request_and_the_server_goes_on(tiny_model,
                                                                                                tmp_path):
    """A local worker whose part the sink cannot use (a test fault here; in life, a model whose rows
    are not as wide as it declares) is replaced and its job given to another, and a job that makes
    every worker send junk fails its request. The sink once took a local worker's part for one from
    the network naming a local worker's job, a forgery, so the ventilator ignored it and the request
    waited out its timeout."""
    texts = random_texts(20, seed=43)
    with running_server(tiny_model, "--num-worker", "2", tmp_path=tmp_path, env=FAULTS) as server:
        with server.client(timeout=30) as client:
            expected = client.encode(texts)
            started = time.monotonic()
            with pytest.raises(ServerError, match="made a worker crash twice"):
                client.encode(["!badpart from every worker"])
            assert time.monotonic() - started < 20
            wait_for(lambda: server.status()["ready"])
            np.testing.assert_allclose(client.encode(texts), expected, rtol=1e-4, atol=1e-5)
        status = server.status()
    assert status["worker_restarts"] == 2 and status["workers_alive"] == 2
    assert server.log.count("sent a part the sink could not use") == 2 and "forged" not in server.log
