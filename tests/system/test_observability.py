"""What an operator sees: Prometheus metrics without the gateway, and JSON logs from every process."""
import json

import pytest

from conftest import free_port, random_texts, running_server, wait_for
from http_helpers import status_code

pytestmark = pytest.mark.timeout(300)


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


def test_the_metrics_port_bounds_stalled_connections_and_cuts_them_at_a_deadline(tiny_model, tmp_path):
    """Connections that send half a request head and stall once held a thread each, for ever (300
    of them: 300 threads). Now at most MAX_SCRAPES are served at once and each is cut
    SCRAPE_DEADLINE after it opened; then scrapes are answered again, and nothing was logged."""
    import socket

    import httpx
    import psutil

    from encoder_server.gateway.metrics_exporter import MAX_SCRAPES, SCRAPE_DEADLINE

    metrics_port = free_port()
    env = {"ENCODER_SERVER_METRICS_PORT": str(metrics_port), "ENCODER_SERVER_NUM_WORKER": "1"}
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with running_server(tiny_model, tmp_path=tmp_path, env=env) as server:
        wait_for(lambda: status_code(url) == 200, timeout=30)
        exporter = next(child for child in psutil.Process(server.process.pid).children() if child.name() == "metrics")
        idle_threads = exporter.num_threads()
        stalled = []
        for _ in range(MAX_SCRAPES + 10):
            connection = socket.create_connection(("127.0.0.1", metrics_port), timeout=5)
            connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the end of the head
            stalled.append(connection)
        assert exporter.num_threads() <= idle_threads + MAX_SCRAPES
        wait_for(lambda: exporter.num_threads() <= idle_threads, timeout=2 * SCRAPE_DEADLINE)  # every one cut
        assert "encoder_up 1.0" in httpx.get(url, timeout=5).text
        for connection in stalled:
            connection.close()
    assert "Traceback" not in server.log and "Exception" not in server.log
