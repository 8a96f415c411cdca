"""`--metrics-port`: the server's status as Prometheus metrics, served by the supervisor's own child
process, so a deployment without the HTTP gateway is observable too. It polls SHOW_STATUS once a
second as a client of the server's own ports (with the server's own key under CURVE), and each
scrape reads the latest sample: the same metric families as the gateway's /metrics."""
from prometheus_client import CollectorRegistry, start_http_server

from encoder_client import ConnectionLostError, EncoderClient
from encoder_server.processes import start_child

from .metrics import ServerStatusCollector

POLL_INTERVAL = 1.0


class StatusPoll:
    """The latest status the server answered, or None while it does not answer."""

    def __init__(self, settings):
        self.settings = settings
        self.status = None
        self.client = None

    def refresh(self):
        try:
            self.client = self.client or self.connect()
            self.status = self.client.server_status
        except (TimeoutError, ConnectionLostError, OSError):
            self.status = None
            self.close()

    def connect(self):
        settings = self.settings
        return EncoderClient(settings.client_host, settings.port, settings.port_out, timeout=POLL_INTERVAL * 2,
                             server_key=settings.server_key, client_key=settings.server_key)

    def close(self):
        if self.client is not None:
            self.client.close()
            self.client = None


def serve_metrics(settings):
    log, stop = start_child("metrics", settings.verbose)
    poll = StatusPoll(settings)
    registry = CollectorRegistry()
    registry.register(ServerStatusCollector(poll))
    server, thread = start_http_server(settings.metrics_port, addr=settings.http_host or settings.host,
                                       registry=registry)
    log.info("Prometheus metrics on http://%s:%d/metrics", settings.http_host or settings.host, settings.metrics_port)
    try:
        while not stop.is_set():
            poll.refresh()
            stop.wait(POLL_INTERVAL)
    finally:
        poll.close()
        server.shutdown()
        thread.join(5)
