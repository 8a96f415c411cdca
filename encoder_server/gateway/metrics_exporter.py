"""`--metrics-port`: the server's status as Prometheus metrics, served by the supervisor's own child
process, so a deployment without the HTTP gateway is observable too. It polls SHOW_STATUS once a
second as a client of the server's own ports (with the server's own key under CURVE), and each
scrape reads the latest sample: the same metric families as the gateway's /metrics."""
import socket
import threading
import time
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from encoder_client import ConnectionLostError, EncoderClient
from encoder_server.processes import start_child

from .metrics import ServerStatusCollector

POLL_INTERVAL = 1.0
MAX_SCRAPES = 40        # connections served at once; one more gets a 503 (node_exporter's --web.max-requests)
SCRAPE_DEADLINE = 10.0  # seconds a connection may stay open, whatever it sends (Prometheus' default scrape timeout)
BUSY_RESPONSE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


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
    host = settings.http_host or settings.host
    server = ScrapeServer.listening(host, settings.metrics_port, make_wsgi_app(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    log.info("Prometheus metrics on http://%s:%d/metrics", host, settings.metrics_port)
    try:
        while not stop.is_set():
            poll.refresh()
            server.close_overdue()
            stop.wait(POLL_INTERVAL)
    finally:
        poll.close()
        server.shutdown()
        thread.join(5)


class ScrapeServer(ThreadingMixIn, WSGIServer):
    """prometheus_client's threaded WSGI server, bounded: at most MAX_SCRAPES connections at once
    (one more gets a 503), each closed SCRAPE_DEADLINE seconds after it opened (`close_overdue`,
    called once a second), so that clients that connect and send nothing, or a byte at a time,
    cannot pile up threads."""
    daemon_threads = True

    @classmethod
    def listening(cls, host, port, app):
        return make_server(host, port, app, cls, handler_class=QuietHandler)

    def __init__(self, address, *args, **kwargs):
        self.address_family = socket.getaddrinfo(*address, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self.opened = {}  # connection -> when it opened
        self.lock = threading.Lock()
        super().__init__(address, *args, **kwargs)

    def process_request(self, request, client_address):
        with self.lock:
            full = len(self.opened) >= MAX_SCRAPES
            if not full:
                self.opened[request] = time.monotonic()
        if full:  # as the gateway answers past --http-max-connections; a fresh socket's buffer takes it at once
            try:
                request.sendall(BUSY_RESPONSE)
            except OSError:
                pass
            self.shutdown_request(request)
        else:
            super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.opened.pop(request, None)

    def handle_error(self, request, client_address):
        """A client that went away, or was cut off at its deadline: nothing to log (socketserver
        would print a traceback for each)."""

    def close_overdue(self):
        """Shut the connections open longer than SCRAPE_DEADLINE: their threads' reads end at once."""
        since = time.monotonic() - SCRAPE_DEADLINE
        with self.lock:
            overdue = [request for request, opened in self.opened.items() if opened < since]
        for request in overdue:
            try:
                request.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        """Scrapes are not logged."""
