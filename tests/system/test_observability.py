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
