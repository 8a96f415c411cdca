"""What the supervisor's HTTP children run: the built-in gateway (--http-port) and the Prometheus
exporter (--metrics-port). The CLI hands these to the supervisor, which imports only this module:
each child imports its HTTP stack itself."""
from encoder_server.processes import STOP_SIGNAL, start_child

from .limits import HTTP_LIMITS


def run_gateway(settings):
    """The built-in gateway: a client of the server's own ports (with the server's own CURVE key)."""
    from .serve import serve_http

    start_child("gateway", settings.verbose)
    raise SystemExit(serve_http(settings.http_host or settings.host, settings.http_port, settings.client_host,
                                settings.port, settings.port_out, server_key=settings.server_key,
                                client_key=settings.server_key, api_key=settings.api_key, verbose=settings.verbose,
                                limits={name: getattr(settings, name) for name in HTTP_LIMITS},
                                stop_signals=(STOP_SIGNAL,)))


def run_metrics_exporter(settings):
    """--metrics-port: the server's status as Prometheus metrics, without the gateway."""
    from .metrics_exporter import serve_metrics

    serve_metrics(settings)


# name -> (the setting that asks for the process, what it runs)
HTTP_CHILDREN = {"gateway": ("http_port", run_gateway), "metrics": ("metrics_port", run_metrics_exporter)}
