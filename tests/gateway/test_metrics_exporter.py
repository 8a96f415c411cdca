"""The metrics exporter's scrape server, in process: a cap on connections and a deadline for each."""
import socket
import threading

import httpx
from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

from conftest import free_port, wait_for
from encoder_server.gateway import metrics_exporter


def test_scrapes_past_the_cap_get_503_and_overdue_connections_are_cut(monkeypatch):
    monkeypatch.setattr(metrics_exporter, "MAX_SCRAPES", 2)
    registry = CollectorRegistry()
    Gauge("probe", "a value to scrape", registry=registry).set(7)
    port = free_port()
    server = metrics_exporter.ScrapeServer.listening("127.0.0.1", port, make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        assert "probe 7.0" in httpx.get(url, timeout=5).text
        # that scrape counts until its thread has closed the connection, a moment after its reply
        wait_for(lambda: not server.opened, timeout=10)
        stalled = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(2)]
        for connection in stalled:
            connection.sendall(b"GET /metrics HTTP/1.1\r\n")  # the head never ends
        wait_for(lambda: len(server.opened) == 2, timeout=10)
        assert httpx.get(url, timeout=5).status_code == 503
        server.close_overdue()  # neither is overdue yet
        assert len(server.opened) == 2
        monkeypatch.setattr(metrics_exporter, "SCRAPE_DEADLINE", 0.0)
        server.close_overdue()
        wait_for(lambda: not server.opened, timeout=10)  # their threads saw the end of their reads
        assert httpx.get(url, timeout=5).status_code == 200
        for connection in stalled:
            connection.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
