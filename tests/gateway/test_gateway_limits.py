"""The HTTP gateway's connection limits, over raw sockets on loopback, against real processes: the
gateway built into `encoder-server start` and one run by `encoder-server http`. A connection slow to
send its request head or its body is closed, an idle keep-alive connection too, a request over the
connection cap gets 503; /status.json shows no process ids and /openapi.json needs the API key."""
import http.client
import json
import re
import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port, running_server, wait_for
from http_helpers import running_gateway

pytestmark = pytest.mark.timeout(120)
API_KEY = "sk-test-limits"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SLACK = 3.0  # seconds past a deadline that the close may take on a loaded machine
BUILT_IN = {"--http-header-timeout": 1, "--http-body-timeout": 1, "--http-keep-alive": 1}
STANDALONE = {"--http-header-timeout": 2, "--http-body-timeout": 2, "--http-keep-alive": 2,
              "--http-max-connections": 4}


def _flags(limits):
    return [str(part) for flag, value in limits.items() for part in (flag, value)]


class Endpoint:
    def __init__(self, port, limits):
        self.port, self.limits = port, limits
        self.url = f"http://127.0.0.1:{port}"

    def limit(self, flag):
        return self.limits[flag]

    def get(self, path, **kwargs):
        return httpx.get(self.url + path, timeout=30, **kwargs)

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """A server with its built-in gateway (`start --http-port`), short limits and an API key."""
    http_port = free_port()
    with running_server(tiny_model, "--num-worker", "2", "--http-port", str(http_port), "--http-host", "127.0.0.1",
                        "--api-key", API_KEY, *_flags(BUILT_IN),
                        tmp_path=tmp_path_factory.mktemp("limits")) as server:
        server.gateway = Endpoint(http_port, BUILT_IN)
        wait_for(lambda: _ready(server.gateway), timeout=60)
        yield server


@pytest.fixture(scope="module")
def standalone(server, tmp_path_factory):
    """`encoder-server http` in front of the same server, with its own limits and a cap of 4 connections."""
    with running_gateway(server.port, server.port_out, tmp_path_factory.mktemp("standalone"),
                         *_flags(STANDALONE)) as gateway:
        gateway.wait_status("/ready", 200)
        yield Endpoint(gateway.port, STANDALONE)


@pytest.fixture(params=["built-in", "standalone"])
def gateway(request, server):
    return server.gateway if request.param == "built-in" else request.getfixturevalue("standalone")


def _ready(endpoint):
    try:
        return endpoint.get("/ready").status_code == 200
    except httpx.TransportError:
        return False


def closed_within(sock, start, limit):
    """What the server sent until it closed `sock`, and the seconds from `start`; fails if it stays
    open more than `limit` seconds after `start`."""
    sock.settimeout(max(0.1, start + limit - time.monotonic()))
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    except socket.timeout:
        pytest.fail(f"the connection was still open {limit:g}s on; it sent {received[:200]!r}")
    return received, time.monotonic() - start


def _status(response_bytes):
    return int(response_bytes.split(b" ", 2)[1]) if response_bytes else None


# ----- the request head -----

@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nHost: test\r\n"], ids=["nothing", "half a head"])
def test_a_connection_without_a_complete_head_is_closed_after_the_header_timeout(gateway, sent):
    timeout = gateway.limit("--http-header-timeout")
    with gateway.connect() as slow:
        start = time.monotonic()
        slow.sendall(sent)
        assert gateway.get("/health").status_code == 200  # others are served meanwhile
        received, elapsed = closed_within(slow, start, timeout + SLACK)
    assert received == b"" and elapsed >= timeout - 0.05, (received, elapsed)


def test_a_head_trickled_a_byte_at_a_time_is_closed_all_the_same(gateway):
    timeout = gateway.limit("--http-header-timeout")
    head = b"GET /health HTTP/1.1\r\nHost: test\r\nX-Padding: " + b"x" * 200
    with gateway.connect() as slow:
        start = time.monotonic()
        try:
            for byte in head:
                if time.monotonic() - start > timeout + SLACK:
                    break
                slow.sendall(bytes([byte]))
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: what the test wants
        closed_within(slow, start, timeout + SLACK)


def test_the_next_head_on_a_kept_alive_connection_has_the_same_deadline(gateway):
    timeout = gateway.limit("--http-header-timeout")
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    connection.request("GET", "/health")
    assert connection.getresponse().read() == b'{"alive":true}'
    connection.request("GET", "/health")  # the same connection: kept alive
    assert json.loads(connection.getresponse().read()) == {"alive": True}
    slow = connection.sock
    start = time.monotonic()
    slow.sendall(b"GET /health HTTP/1.1\r\nHo")
    received, elapsed = closed_within(slow, start, timeout + SLACK)
    assert received == b"" and elapsed >= timeout - 0.05, (received, elapsed)
    connection.close()


# ----- the body -----

def test_a_body_that_stalls_gets_408_and_is_closed_after_the_body_timeout(gateway):
    timeout = gateway.limit("--http-body-timeout")
    head = ("POST /v1/embeddings HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Length: 1000\r\n\r\n").encode()
    with gateway.connect() as slow:
        start = time.monotonic()
        slow.sendall(head + b'{"input": ')  # 10 of the 1000 bytes
        ok = httpx.post(gateway.url + "/encode", json={"id": 1, "texts": ["a dog"]}, headers=AUTH, timeout=30)
        assert ok.status_code == 200 and len(ok.json()["result"]) == 1  # a whole body is read as before
        received, elapsed = closed_within(slow, start, timeout + SLACK)
    assert _status(received) == 408 and elapsed >= timeout - 0.05, (received, elapsed)
    assert b"connection: close" in received.lower()
    assert json.loads(received.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


# ----- keep-alive -----

def test_an_idle_kept_alive_connection_is_closed_after_the_keep_alive_timeout(gateway):
    keep_alive = gateway.limit("--http-keep-alive")
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    connection.request("GET", "/health")
    connection.getresponse().read()
    time.sleep(keep_alive / 4)
    connection.request("GET", "/health")  # still open a moment later
    response = connection.getresponse()
    assert response.status == 200 and response.read() == b'{"alive":true}'
    start = time.monotonic()
    received, elapsed = closed_within(connection.sock, start, keep_alive + SLACK)
    assert received == b"" and elapsed >= keep_alive / 2, (received, elapsed)
    connection.close()


# ----- the connection cap -----

def test_a_request_past_the_connection_cap_gets_503_and_is_closed(standalone):
    cap = standalone.limit("--http-max-connections")
    idle = [standalone.connect() for _ in range(cap)]
    try:
        time.sleep(0.3)  # the gateway accepts them
        with standalone.connect() as extra:
            start = time.monotonic()
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: test\r\n\r\n")
            received, _ = closed_within(extra, start, SLACK)
        assert _status(received) == 503, received
        idle.pop().close()
        wait_for(lambda: standalone.get("/health").status_code == 200, timeout=10)  # cap - 1 idle + this one
    finally:
        for sock in idle:
            sock.close()


# ----- what stays open under --api-key -----

def test_status_json_names_workers_without_their_process_ids(server):
    gateway = server.gateway
    pids = server.worker_pids()
    assert len(pids) == 2
    wait_for(lambda: gateway.get("/status.json").json()["status"]["workers_alive"] == 2, timeout=30)
    response = gateway.get("/status.json")  # open: the status page's script sends no key
    assert response.status_code == 200
    status = response.json()["status"]
    assert set(status["worker_busy_texts"]) == set(status["worker_texts_encoded"]) == {"worker-0", "worker-1"}
    for pid in pids:
        assert not re.search(rf"worker-\d+:{pid}\b", response.text), pid
    metrics = gateway.get("/metrics").text
    labels = {sample.labels["worker"] for family in text_string_to_metric_families(metrics)
              for sample in family.samples if family.name == "encoder_worker_busy_texts"}
    assert labels == {"worker-0", "worker-1"}


def test_openapi_json_needs_the_api_key_and_the_status_page_stays_open(server):
    gateway = server.gateway
    refused = gateway.get("/openapi.json")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert gateway.get("/openapi.json", headers=AUTH).json()["paths"]["/v1/embeddings"]
    for path in ("/", "/status.json", "/health", "/ready", "/metrics"):
        assert gateway.get(path).status_code == 200, path
    for path in ("/docs", "/redoc"):
        assert gateway.get(path).status_code in (401, 404), path
