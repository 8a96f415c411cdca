"""Attacks that once knocked out workers, hung clients, blocked restarts or leaked embeddings, each
reproduced against real processes on loopback. Every test here failed before its fix."""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from encoder_server.supervisor import RUN_DIR_PREFIX

from conftest import free_port, group_alive, peak_rss_mb, random_texts, running_server, wait_for
from http_helpers import running_gateway, status_code

pytestmark = pytest.mark.timeout(300)
API_KEY = "sk-hardening"


def raw_sockets(server, identity):
    """A PUSH to the request port and a SUB for `identity` on the result port, as a peer without our client."""
    context = zmq.Context.instance()
    push, sub = context.socket(zmq.PUSH), context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, identity + b"\0")  # the identity's whole topic
    for sock, port in ((push, server.port), (sub, server.port_out)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.3)  # let the subscription reach the sink
    return push, sub


def replies(sub, count, timeout_ms=10000):
    received = []
    while len(received) < count and sub.poll(timeout_ms):
        frames = sub.recv_multipart()
        received.append((frames[0], json.loads(frames[1]), frames))
    return received


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path_factory.mktemp("hardening")) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    with running_gateway(server.port, server.port_out, tmp_path_factory.mktemp("gateway"),
                         "--api-key", API_KEY) as gateway:
        gateway.wait_status("/ready", 200)
        yield gateway


def authorized(**headers):
    return {"headers": {"Authorization": f"Bearer {API_KEY}", **headers}}


# ----- poison input -----

def test_lone_surrogates_are_refused_at_intake_and_no_worker_dies(server, gateway):
    push, sub = raw_sockets(server, b"surrogates")
    for req_id in range(6):
        push.send_multipart([b"surrogates", b'["fine", "\\ud800"]', b"%d" % req_id, b"2"])
    errors = replies(sub, 6)
    assert len(errors) == 6 and all("texts[1] holds a lone surrogate (U+D800)" in e[1]["error"] for e in errors)
    model = gateway.get("/v1/models", **authorized()).json()["data"][0]["id"]
    body = '{"model": "%s", "input": ["ok", "\\udfff"]}' % model
    openai = gateway.post("/v1/embeddings", None, content=body, **authorized(**{"Content-Type": "application/json"}))
    assert openai.status_code == 400 and "lone surrogate" in openai.json()["error"]["message"], openai.text
    bert = gateway.post("/encode", None, content='{"id": 1, "texts": ["\\ud83d"]}', **authorized())
    assert bert.status_code == 400 and "lone surrogate" in bert.json()["error"], bert.text
    with server.client() as client:
        with pytest.raises(ValueError, match="lone surrogate"):
            client.encode(["\ud800"])
        assert client.encode(["a cat"]).shape == (1, 32)
        assert client.server_status["worker_restarts"] == 0


@pytest.mark.parametrize("bomb", ["the cat sat " * 900_000, "a" * 10_000_000], ids=["words", "no-spaces"])
def test_a_10_mb_text_is_cut_before_the_tokenizer_and_keeps_the_worker_flat(server, bomb):
    """A tokenizer's memory grows with its input: a 10 MB text once took a worker to 1.1 GB and
    killed it. Its embedding is that of its first max_seq_len tokens, as for any long text."""
    with server.client() as client:
        client.encode(["warm up " * 40] * 8)
        (worker,) = server.worker_pids()
        before = peak_rss_mb(worker)
        rows = client.encode([bomb, "a dog"])
        prefix = client.encode([bomb[:3000], "a dog"])
        after = peak_rss_mb(worker)
        assert client.server_status["worker_restarts"] == 0
    np.testing.assert_allclose(rows, prefix, rtol=1e-5, atol=1e-6)
    assert after - before < 100, f"the worker's peak RSS grew by {after - before:.0f} MB"


def test_deep_nesting_and_non_numbers_get_400_in_each_routes_shape(gateway):
    deep = "[" * 100_000 + "]" * 100_000
    for body, words in ((deep, "nested too deeply"), ('{"id": %s, "texts": ["a"]}' % deep, "nested too deeply"),
                        ('{"id": NaN, "texts": ["a"]}', "NaN is not a JSON number"),
                        ('{"id": 1e999, "texts": ["a"]}', "too large for a number"),
                        ('{"id": %s, "texts": ["a"]}' % ("[" * 40 + "]" * 40), "id is nested more than 32")):
        response = gateway.post("/encode", None, content=body, **authorized())
        assert response.status_code == 400, (words, response.text)
        assert response.json()["status"] == 400 and words in response.json()["error"]
    response = gateway.post("/v1/embeddings", None, content=deep, **authorized(**{"Content-Type": "application/json"}))
    assert response.status_code == 400 and "error" in response.json(), response.text
    assert gateway.post("/encode", {"id": {"batch": [1, "a"]}, "texts": ["a"]}, **authorized()).status_code == 200


def test_the_api_key_is_checked_before_the_body_is_read(gateway):
    """A keyless client declares a 50 MB body and sends none: the 401 comes at once, before any byte."""
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=5)
    connection.putrequest("POST", "/v1/embeddings")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(50 << 20))
    connection.endheaders()
    response = connection.getresponse()  # raises socket.timeout if the gateway waits for the body
    assert response.status == 401 and json.loads(response.read())["error"]["code"] == "invalid_api_key"
    connection.close()


# ----- hostile peers -----

def test_one_hostile_request_never_ends_the_ventilator(server):
    """Each of these once raised an exception in the ventilator's loop, and the server exited 1."""
    push, sub = raw_sockets(server, b"hostile")
    hostile = [
        [b"hostile", b'["a"]', b"1", b"1", b'{"timeout_ms": 1' + b"0" * 400 + b"}"],
        [b"hostile", b"[" * 100000 + b"]" * 100000, b"2", b"1"],
        [b"hostile", b'["a"]', b"3", b"1", b'{"a":' * 50000 + b"1" + b"}" * 50000],
        [b"hostile", b'["a"]', b"4", b"1", b'{"timeout_ms": Infinity}'],
        [b"hostile", b'["a"]', b"5", b"1", b'{"is_tokenized": "yes"}'],
        [b"hostile", b'["a"]', b"-6", b"1"],
    ]
    for frames in hostile:
        push.send_multipart(frames)
    errors = replies(sub, len(hostile))
    assert len(errors) == len(hostile) and all(e[1]["code"] == "bad_request" for e in errors), errors
    with server.client() as client:
        assert client.encode(["still serving"]).shape == (1, 32)
    assert server.process.poll() is None


def test_a_request_id_already_in_flight_is_refused(server):
    push, sub = raw_sockets(server, b"twice")
    payload = json.dumps(random_texts(3000, seed=3, min_words=20)).encode()
    for _ in range(2):
        push.send_multipart([b"twice", payload, b"77", b"3000"])
    got = replies(sub, 2, timeout_ms=60000)
    errors = [reply for _, reply, frames in got if "error" in reply]
    results = [frames for _, reply, frames in got if "error" not in reply]
    assert len(errors) == 1 and "req_id 77 is already in flight" in errors[0]["error"]
    assert len(results) == 1 and json.loads(results[0][1])["shape"] == [3000, 32]


def test_only_exact_identities_may_subscribe(server):
    """A raw SUB with an empty topic, or a prefix of a client's identity, once received every
    client's embeddings."""
    context = zmq.Context.instance()
    eavesdroppers = []
    with server.client(identity="victim-client-0001") as client:
        for topic in (b"", b"victim", b"v"):
            sub = context.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, topic)
            sub.connect(f"tcp://127.0.0.1:{server.port_out}")
            eavesdroppers.append(sub)
        time.sleep(0.5)
        assert client.encode(["a secret sentence"]).shape == (1, 32)
    for sub in eavesdroppers:
        assert not sub.poll(1000), "an eavesdropper received a client's reply"
        sub.close()
    assert "refused a subscription" in server.log


# ----- signals and process death -----

def test_sigterm_to_the_whole_group_drains_in_flight_requests(tiny_model, tmp_path):
    """systemd's KillMode, `kill -- -PGID`: children ignore the group's SIGTERM and the supervisor
    drains; the client's request in flight completes."""
    texts = random_texts(3000, seed=5, min_words=20, max_words=40)
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path) as server:
        with server.client() as client:
            client.encode(texts, blocking=False)
            time.sleep(0.3)
            os.killpg(server.process.pid, signal.SIGTERM)
            result = client.fetch_all(concat=True)
        assert server.process.wait(30) == 0
    assert result.shape == (3000, 32)


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
        failures, done, seconds = [], [], []

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
                    seconds.append(time.monotonic() - started)
                    np.testing.assert_allclose(rows, expected[index], rtol=1e-5, atol=1e-6)
                    done.append(index)

        threads = [threading.Thread(target=encode_for_a_while) for _ in range(3)]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(done) >= 6)
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads), "a client hung"
        assert failures == [] and len(done) == 90
        assert server.process.poll() is None and f"{victim} exited unexpectedly" in server.log
        print(f"kill -9 of the {victim}: the slowest request took {max(seconds):.2f}s, the median "
              f"{np.median(seconds):.2f}s")


# ----- operations -----

def test_metrics_port_serves_prometheus_without_the_gateway(tiny_model, tmp_path):
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    metrics_port = free_port()
    env = {"ENCODER_SERVER_METRICS_PORT": str(metrics_port), "ENCODER_SERVER_NUM_WORKER": "1"}
    with running_server(tiny_model, tmp_path=tmp_path, env=env) as server:
        with server.client() as client:
            client.encode(random_texts(10))

        def sample(name, **labels):
            try:
                text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
            except httpx.ConnectError:
                return None  # the exporter starts beside the server, and may not listen yet
            for family in text_string_to_metric_families(text):
                for found in family.samples:
                    if found.name == name and all(found.labels.get(k) == v for k, v in labels.items()):
                        return found.value
            return None

        wait_for(lambda: sample("encoder_requests_total", outcome="served") == 1, timeout=30)
        assert sample("encoder_up") == 1 and sample("encoder_workers_alive") == 1
        assert sample("encoder_ready") == 1
        wait_for(lambda: sample("encoder_forward_passes_total") >= 1, timeout=10)  # it comes with a heartbeat
    assert "Prometheus metrics on" in server.log


def test_json_logs_from_every_process_and_an_access_log_on_the_gateway(tiny_model, tmp_path):
    import httpx

    http_port = free_port()
    with running_server(tiny_model, "--num-worker", "1", "--http-port", str(http_port), tmp_path=tmp_path,
                        env={"ENCODER_SERVER_LOG_FORMAT": "json"}) as server:
        url = f"http://127.0.0.1:{http_port}"
        wait_for(lambda: status_code(url + "/ready") == 200, timeout=60)
        assert httpx.post(url + "/encode", json={"id": 1, "texts": ["a cat"]}, timeout=30).status_code == 200
    entries = [json.loads(line) for line in server.log.splitlines() if line.startswith("{")]
    assert {"supervisor", "ventilator", "sink", "worker-0", "gateway"} <= {entry["process"] for entry in entries}
    assert all({"time", "pid", "level", "message"} <= set(entry) for entry in entries)
    assert any(entry["logger"] == "uvicorn.access" and "POST /encode" in entry["message"] for entry in entries)
    text_lines = [line for line in server.log.splitlines() if line and not line.startswith("{")]
    assert not [line for line in text_lines if " INFO " in line or " WARNING " in line], text_lines[:5]
