"""The gateway served by uvicorn: standalone (`encoder-server http`) or as the server's built-in
child process (`--http-port`)."""
import contextlib
import signal
import threading

import uvicorn

from encoder_client import AsyncEncoderClient
from encoder_server.logs import configure_logging

from .app import create_app
from .connections import with_header_timeout
from .limits import GATEWAY_TIMEOUT


def serve_http(http_host, http_port, server_host, port, port_out, *, server_key=None, client_key=None,
               api_key=None, verbose=False, timeout=GATEWAY_TIMEOUT, limits,
               stop_signals=(signal.SIGINT, signal.SIGTERM)):
    """Serve the gateway with uvicorn until one of `stop_signals`; returns the exit code. `limits`:
    a value for each of limits.HTTP_LIMITS, by name."""
    from prometheus_client import disable_created_metrics

    configure_logging("gateway", verbose)
    disable_created_metrics()  # no *_created series: they only add noise to /metrics

    def make_client():
        return AsyncEncoderClient(server_host, port, port_out, timeout=timeout, server_key=server_key,
                                  client_key=client_key)

    app = create_app(make_client, api_key=api_key, body_timeout=limits["http_body_timeout"])
    # uvicorn answers 503 once `limit_concurrency` connections are open counting the asking one: + 1
    # serves --http-max-connections of them
    config = uvicorn.Config(app, host=http_host, port=http_port, log_level="debug" if verbose else "info",
                            access_log=True, log_config=None, timeout_graceful_shutdown=5,
                            http=with_header_timeout(limits["http_header_timeout"]),
                            timeout_keep_alive=limits["http_keep_alive"],
                            limit_concurrency=limits["http_max_connections"] + 1)
    server = _Server(config, stop_signals)
    try:
        server.run()
    except SystemExit as exit_:  # uvicorn exits when it cannot bind
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0 if server.started else 1


class _Server(uvicorn.Server):
    """uvicorn's server, stopped gracefully by `stop_signals` alone (the supervisor's own signal for
    its built-in gateway, which ignores the group's SIGTERM), never re-raising it after shutdown."""

    def __init__(self, config, stop_signals):
        super().__init__(config)
        self.stop_signals = stop_signals

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, self.handle_stop) for signum in self.stop_signals}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def handle_stop(self, *_):
        self.should_exit = True
