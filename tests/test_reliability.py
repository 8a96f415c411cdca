"""Every reliability promise, broken on purpose: real processes, kill -9, poison, restarts,
overload, deadlines and CURVE. Faults come from the test-only hook in encoder_server.fault_injection."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime

import numpy as np
import pytest
import zmq

from conftest import free_port, random_texts, running_server, wait_for
from encoder_client import ConnectionLostError, EncoderClient, IdentityRefusedError, ServerBusyError, ServerError

pytestmark = pytest.mark.timeout(300)
FAULTS = {"ENCODER_SERVER_FAULTS": "1"}


def _status(server):
    with server.client(timeout=10) as client:
        return client.server_status


def test_kill_9_worker_mid_request_loses_and_duplicates_nothing(tiny_model, tmp_path):
    texts = random_texts(5000, seed=21, min_words=5, max_words=30)
    texts[2500] = "!sleep 1"  # holds one worker's intake, so the request is surely in flight at the kill
    with running_server(tiny_model, "--num-worker", "2", tmp_path=tmp_path, env=FAULTS) as server:
        with server.client() as client:
            undisturbed = client.encode(texts)
            client.encode(texts, blocking=False)
            wait_for(lambda: _status(server)["in_flight_requests"] == 1 and
                     all(_status(server)["worker_busy_texts"].values()))
            os.kill(server.worker_pids()[0], signal.SIGKILL)
            disturbed = client.fetch_all(concat=True)
        assert disturbed.shape == undisturbed.shape
        np.testing.assert_allclose(disturbed, undisturbed, rtol=1e-4, atol=1e-5)
        wait_for(lambda: _status(server)["ready"])
        status = _status(server)
        assert status["worker_restarts"] == 1 and status["jobs_redispatched"] >= 1
        assert status["workers_alive"] == 2


def test_poisoned_input_fails_only_its_request_and_the_server_recovers(tiny_model, tmp_path):
    poisoned = random_texts(100, seed=3)
    poisoned[57] = "!crash here"
    bystander_texts = random_texts(40, seed=4)
    with running_server(tiny_model, "--num-worker", "2", "--max-batch-size", "16", tmp_path=tmp_path,
                        env=FAULTS) as server:
        with server.client() as victim, server.client() as bystander:
            expected = bystander.encode(bystander_texts)
            victim.encode(poisoned, blocking=False)
            for _ in range(5):
                np.testing.assert_allclose(bystander.encode(bystander_texts), expected, rtol=1e-4, atol=1e-5)
            with pytest.raises(ServerError, match="texts 48 to 63 of this request made a worker crash twice"):
                victim.fetch_all()
            wait_for(lambda: _status(server)["ready"])
            np.testing.assert_allclose(victim.encode(bystander_texts), expected, rtol=1e-4, atol=1e-5)
        status = _status(server)
        assert status["requests"]["failed"] == 1 and status["worker_restarts"] == 2


def test_worker_that_stops_beating_is_replaced(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "2", tmp_path=tmp_path) as server:
        frozen = server.worker_pids()[0]
        os.kill(frozen, signal.SIGSTOP)  # alive to the OS, silent to the ventilator
        wait_for(lambda: _status(server)["worker_restarts"] == 1, timeout=30)
        wait_for(lambda: _status(server)["ready"])
        assert frozen not in server.worker_pids()
        with server.client() as client:
            assert client.encode(random_texts(50)).shape == (50, 32)


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
        started = time.monotonic()
        server.stop()
        with pytest.raises(ConnectionLostError):
            client.fetch_all()
        assert time.monotonic() - started < 20
    with running_server(tiny_model, tmp_path=tmp_path / "b", ports=ports):
        with client:
            assert client.encode(["back again"], retries=3).shape == (1, 32)


def _group_rss_mb(pgid):
    total = 0
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and os.getpgid(int(pid)) == pgid:
                with open(f"/proc/{pid}/status") as status:
                    total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def test_overload_gets_busy_errors_memory_stays_bounded_and_accepted_work_completes(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "1", "--max-pending-texts", "1000", tmp_path=tmp_path,
                        env=FAULTS) as server:
        with server.client() as client:
            client.encode(random_texts(200))  # warm
            rss_before = _group_rss_mb(server.process.pid)
            held = ["!sleep 2", *random_texts(799, seed=6)]
            client.encode(held, blocking=False)
            wait_for(lambda: _status(server)["queue_depth"]["pending_texts"] == 800)
            flood = [random_texts(300, seed=seed) for seed in range(300)]
            for batch in flood:
                client.encode(batch, blocking=False)
            busy = accepted = 0
            for _ in range(len(flood) + 1):
                try:
                    _, result = next(client.fetch())
                    assert result.shape in ((300, 32), (800, 32))
                    accepted += 1
                except ServerBusyError as error:
                    assert "server busy" in str(error)
                    busy += 1
            rss_after = _group_rss_mb(server.process.pid)
        # the held request frees its room after 2 s, so a few of the flood's may get in after it
        assert busy + accepted == len(flood) + 1 and busy >= len(flood) // 2 and accepted >= 1
        assert _status(server)["requests"]["busy"] == busy
        assert rss_after - rss_before < 150, f"server RSS grew {rss_after - rss_before:.0f} MB"


def test_request_whose_client_timed_out_is_never_computed(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "1", "--prefetch-size", "1", tmp_path=tmp_path,
                        env=FAULTS) as server:
        with server.client(timeout=30) as patient, server.client(timeout=0.5) as hasty:
            patient.encode(["!sleep 2"], blocking=False)  # the only worker's intake sleeps 2 s
            wait_for(lambda: _status(server)["in_flight_requests"] == 1)
            with pytest.raises(TimeoutError):
                hasty.encode(random_texts(300, seed=9))
            patient.fetch_all()
        assert_never_computed(server, expired=300, encoded=1)


# Loaded by every process of a server started with this folder on PYTHONPATH; it puts the wall
# clock of worker processes (and theirs only) `ENCODER_TEST_WORKER_CLOCK_SKEW` seconds off.
SKEWED_WORKER_CLOCK = """
import multiprocessing, os, time
_skew, _wall = float(os.environ["ENCODER_TEST_WORKER_CLOCK_SKEW"]), time.time
time.time = lambda: _wall() + (_skew if multiprocessing.current_process().name.startswith("worker") else 0.0)
"""


@pytest.mark.parametrize("skew", [30.0, -30.0])
def test_a_worker_whose_clock_is_off_computes_live_jobs_and_drops_dead_ones(tiny_model, tmp_path, skew):
    """Deadlines travel as budgets: a worker 30 s ahead must not drop what clients still wait for,
    and one 30 s behind must not compute what they gave up on."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SKEWED_WORKER_CLOCK)
    env = {**FAULTS, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "ENCODER_TEST_WORKER_CLOCK_SKEW": str(skew)}
    with running_server(tiny_model, "--num-worker", "1", "--prefetch-size", "1", tmp_path=tmp_path,
                        env=env) as server:
        assert abs(_worker_clock_offset(server.log) - skew) < 5, server.log
        with server.client(timeout=5) as live:
            assert live.encode(random_texts(100, seed=8)).shape == (100, 32)
        with server.client(timeout=30) as patient, server.client(timeout=0.5) as hasty:
            patient.encode(["!sleep 2"], blocking=False)  # the worker's prefetch sleeps 2 s
            wait_for(lambda: _status(server)["in_flight_requests"] == 1)
            with pytest.raises(TimeoutError):
                hasty.encode(random_texts(300, seed=9))
            patient.fetch_all()
        assert_never_computed(server, expired=300, encoded=101)
        waits = _status(server)["metrics"]["histograms"]["queue_seconds"]
        assert waits["count"] and waits["sum"] / waits["count"] < 3, waits  # not 30 s off either


def _worker_clock_offset(log):
    """Seconds between the worker's and the ventilator's clocks, from the two lines each logs as
    the worker joins (a few milliseconds apart in real time)."""
    def stamp(pattern):
        line = next(line for line in log.splitlines() if re.search(pattern, line))
        return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return stamp(r"worker-0 INFO serving on") - stamp(r"ventilator INFO worker-0:\d+ ready")

def assert_never_computed(server, expired, encoded):
    """Once every text is accounted for (a worker reports the jobs it dropped a moment after it
    drops them), exactly `expired` texts were never computed and `encoded` were."""
    wait_for(lambda: sum(_status(server)["texts"][kind] for kind in ("expired", "encoded")) >= expired + encoded)
    status = _status(server)
    assert status["in_flight_requests"] == 0 and status["requests"]["expired"] == 1
    assert (status["texts"]["expired"], status["texts"]["encoded"]) == (expired, encoded)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    for name, where in (("server", "server"), ("alice", "authorized"), ("mallory", "strangers")):
        subprocess.run([sys.executable, "-m", "encoder_server.cli", "keygen", str(folder / where), "--name", name],
                       check=True, capture_output=True)
    return folder


def test_curve_admits_authorized_clients_only(tiny_model, tmp_path, keys):
    server_public = keys / "server" / "server.key"
    alice = {"server_key": str(server_public), "client_key": str(keys / "authorized" / "alice.key_secret")}
    with running_server(tiny_model, "--server-key", str(keys / "server" / "server.key_secret"),
                        "--authorized-clients", str(keys / "authorized"), tmp_path=tmp_path,
                        client_keys=alice) as server:
        port_args = ("127.0.0.1", server.port, server.port_out)
        strangers = zmq.Context()  # raw sockets of their own, torn down with their context
        eavesdropper = strangers.socket(zmq.SUB)
        eavesdropper.setsockopt(zmq.SUBSCRIBE, b"")
        eavesdropper.curve_serverkey = zmq.auth.load_certificate(str(server_public))[0]
        eavesdropper.curve_publickey, eavesdropper.curve_secretkey = zmq.auth.load_certificate(
            str(keys / "strangers" / "mallory.key_secret"))
        eavesdropper.connect(f"tcp://127.0.0.1:{server.port_out}")
        plain = strangers.socket(zmq.SUB)
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        plain.connect(f"tcp://127.0.0.1:{server.port_out}")

        with server.client(timeout=20) as authorized:
            assert authorized.encode(random_texts(10)).shape == (10, 32)
            config = authorized.server_config
            assert config["curve"] and config["clients_authenticated"]
            assert not any(str(keys) in str(value) for value in config.values())
        with pytest.raises((PermissionError, TimeoutError)):
            EncoderClient(*port_args, timeout=3, server_key=str(server_public),
                          client_key=str(keys / "strangers" / "mallory.key_secret"))
        with pytest.raises((PermissionError, TimeoutError)):
            EncoderClient(*port_args, timeout=3)  # no CURVE at all, so it cannot even stop the server
        for sock in (eavesdropper, plain):
            assert not sock.poll(500), "an unauthorized subscriber received something"
        strangers.destroy(linger=0)
        assert _status(server)["ready"]


def test_curve_server_key_admits_its_own_workers_and_gateway(tiny_model, tmp_path, keys):
    """With worker ports open, local workers and the built-in gateway connect with the server's
    own key, which --authorized-clients need not list."""
    import httpx

    alice = {"server_key": str(keys / "server" / "server.key"),
             "client_key": str(keys / "authorized" / "alice.key_secret")}
    http_port = free_port()
    with running_server(tiny_model, "--server-key", str(keys / "server" / "server.key_secret"),
                        "--authorized-clients", str(keys / "authorized"), "--worker-port", str(free_port(consecutive=2)),
                        "--http-port", str(http_port), "--num-worker", "2", tmp_path=tmp_path,
                        client_keys=alice) as server:
        texts = random_texts(40, seed=3)
        with server.client(timeout=20) as client:
            expected = client.encode(texts)
        wait_for(lambda: _http_ready(http_port), timeout=30)
        reply = httpx.post(f"http://127.0.0.1:{http_port}/encode", json={"id": 7, "texts": texts}, timeout=30)
        assert reply.status_code == 200, reply.text
        np.testing.assert_allclose(np.array(reply.json()["result"], dtype=np.float32), expected, atol=1e-6)


def _http_ready(port):
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_oversized_request_is_refused_and_costs_the_server_nothing(tiny_model, tmp_path):
    with running_server(tiny_model, "--max-request-mb", "1", tmp_path=tmp_path) as server:
        with server.client(timeout=10) as client:
            with pytest.raises(ValueError, match="above the server's limit of 1 MB"):
                client.encode(["word " * 300_000])
            hostile = zmq.Context().socket(zmq.PUSH)  # its own context: its I/O is none of the client's
            hostile.connect(f"tcp://127.0.0.1:{server.port}")
            hostile.send_multipart([b"hostile", os.urandom(3 << 20), b"1", b"1"])  # ZeroMQ drops the peer
            assert client.encode(["still fine"]).shape == (1, 32)
            assert client.server_status["ready"]
            hostile.context.destroy(linger=0)


def test_slow_reader_loses_no_reply(tiny_model, tmp_path):
    """A subscriber that stops reading while ~25 MB of results pile up still gets every reply
    (its data, or an error such as busy) once it reads again: nothing is dropped silently."""
    identity, count = b"slow-reader", 2500
    with running_server(tiny_model, "--num-worker", "2", "--max-pending-texts", "1000000",
                        tmp_path=tmp_path) as server:
        _read_slowly(server, identity, count)
        assert "is not keeping up; holding its replies" in server.log


def _read_slowly(server, identity, count):
    context = zmq.Context.instance()
    reader = context.socket(zmq.SUB)
    reader.setsockopt(zmq.RCVHWM, 10)
    reader.setsockopt(zmq.RCVBUF, 4096)  # a small kernel buffer, so the backlog stays in the sink
    reader.setsockopt(zmq.SUBSCRIBE, identity + b"\0")
    reader.connect(f"tcp://127.0.0.1:{server.port_out}")
    sender = context.socket(zmq.PUSH)
    sender.connect(f"tcp://127.0.0.1:{server.port}")
    time.sleep(0.5)  # let the subscription reach the sink
    texts = json.dumps(random_texts(100, seed=13)).encode()
    for req_id in range(count):
        sender.send_multipart([identity, texts, b"%d" % req_id, b"100"])
    time.sleep(10)  # not reading: the sink's queue for us fills and it must hold replies
    replies = set()
    while len(replies) < count and reader.poll(30_000):
        replies.add(int(reader.recv_multipart()[-1]))
    for sock in (reader, sender):
        sock.close(linger=0)
    assert replies == set(range(count))


def test_curve_binds_an_identity_to_the_first_key_that_uses_it(tiny_model, tmp_path, keys):
    """Two authorized clients: bob may neither read alice's replies nor send requests as her."""
    subprocess.run([sys.executable, "-m", "encoder_server.cli", "keygen", str(keys / "authorized"), "--name", "bob"],
                   check=True, capture_output=True)
    server_public = str(keys / "server" / "server.key")
    as_alice = {"server_key": server_public, "client_key": str(keys / "authorized" / "alice.key_secret")}
    as_bob = {"server_key": server_public, "client_key": str(keys / "authorized" / "bob.key_secret")}
    with running_server(tiny_model, "--server-key", str(keys / "server" / "server.key_secret"),
                        "--authorized-clients", str(keys / "authorized"), tmp_path=tmp_path,
                        client_keys=as_alice) as server:
        with server.client(identity="alice-desk", timeout=20) as alice:
            assert alice.encode(random_texts(5)).shape == (5, 32)
            started = time.monotonic()
            with pytest.raises(IdentityRefusedError, match="refused this client's identity: it belongs to another"):
                server.client(identity="alice-desk", timeout=10, **as_bob)  # the sink says so at once
            assert time.monotonic() - started < 2.0
            context = zmq.Context()
            try:
                impostor = context.socket(zmq.PUSH)
                impostor.curve_serverkey = zmq.auth.load_certificate(server_public)[0]
                impostor.curve_publickey, impostor.curve_secretkey = zmq.auth.load_certificate(
                    as_bob["client_key"])
                impostor.connect(f"tcp://127.0.0.1:{server.port}")
                impostor.send_multipart([b"alice-desk", b'["forged"]', b"1", b"1"])
                time.sleep(1)
            finally:
                context.destroy(linger=0)
            assert alice.encode(random_texts(5)).shape == (5, 32)
            with server.client(identity="bob-desk", timeout=20, **as_bob) as bob:
                assert bob.encode(random_texts(3)).shape == (3, 32)
    assert "belongs to another client key" in server.log
