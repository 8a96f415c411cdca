"""Starts the ventilator, the sink and the workers, watches them, and stops them in order.

A worker that exits for any reason (kill -9, an exception, the OOM killer) is started again:
at once the first time, then after a pause that doubles while it keeps dying young. The
ventilator learns of each exit through a pipe and re-dispatches the dead worker's jobs; it tells
the supervisor in turn of a worker that stopped sending heartbeats, which is then killed and so
replaced. The ventilator and the sink hold every request's state: if one of them dies, the server
stops with a non-zero exit, never silently. With --http-port it also runs the HTTP gateway, a
client of its own ports, restarted whenever it exits.

Stop order: the gateway and the ventilator drain first (in-flight requests finish, new ones are
refused), then the sink and workers stop, then the ipc folder is removed.
"""
import logging
import multiprocessing
import shutil
import signal
import socket
import tempfile
import threading
from multiprocessing.connection import wait

from .backends import prepare_model
from .messages import WorkerExited
from .model_folder import ConfigError
from .runtime import Addresses, WorkerEndpoints
from .security import own_client_keys, workers_use_curve
from .sink import run_sink
from .ventilator import run_ventilator
from .worker_pool import STOP_TIMEOUT, WorkerPool, start_process, stop_process

log = logging.getLogger("supervisor")
WATCH_INTERVAL = 0.2


def check_port_free(host, port):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror}") from None


class Supervisor:
    def __init__(self, settings):
        self.settings = settings
        self.stop_requested = threading.Event()
        self.spawn = multiprocessing.get_context("spawn")
        self.addresses = None
        self.ventilator = None
        self.sink = None
        self.gateway = None
        self.pool = None
        self.events = None       # our end of the pipe to the ventilator

    def serve(self):
        """Run until stopped; returns the process exit code."""
        for host, port in self.settings.listening():
            check_port_free(host, port)
        self.settings = prepare_model(self.settings)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.stop_requested.set())
        run_dir = tempfile.mkdtemp(prefix="encoder-server-")
        try:
            self.addresses = Addresses(self.settings.host, self.settings.port, self.settings.port_out, run_dir,
                                       self.settings.worker_port)
            self.start_children()
            log.info("listening on %s:%d (requests) and %s:%d (results)", self.settings.host, self.settings.port,
                     self.settings.host, self.settings.port_out)
            failed = self.watch()
        finally:
            self.stop_children()
            shutil.rmtree(run_dir, ignore_errors=True)
        log.info("stopped")
        return 1 if failed else 0

    def start_children(self):
        self.events, theirs = self.spawn.Pipe()
        self.sink = start_process(self.spawn, run_sink, "sink", self.settings, self.addresses)
        curve = own_client_keys(self.settings) if workers_use_curve(self.settings) else None
        endpoints = WorkerEndpoints(self.addresses.backend, self.addresses.sink, curve)
        self.pool = WorkerPool(self.spawn, self.settings, endpoints, self.settings.num_worker)
        self.ventilator = start_process(self.spawn, run_ventilator, "ventilator", self.settings, self.addresses,
                                        theirs)
        theirs.close()
        self.start_gateway()

    def start_gateway(self):
        if self.settings.http_port:
            self.gateway = start_process(self.spawn, run_gateway, "gateway", self.settings)

    def watch(self):
        """Keep workers and the gateway running until a stop signal, or until the ventilator or
        sink exits; True if that exit was a failure."""
        while not self.stop_requested.is_set():
            wait([self.ventilator.sentinel, self.sink.sentinel, self.events, *self.pool.sentinels,
                  *([self.gateway.sentinel] if self.gateway else [])], timeout=WATCH_INTERVAL)
            try:
                while self.events.poll():
                    self.pool.kill(self.events.recv().pid)  # messages.WorkerSilent
            except EOFError:  # the ventilator has gone
                self.ventilator.join(STOP_TIMEOUT)
            if self.ventilator.exitcode == 0:
                return False  # drained after a TERMINATION request
            for core in (self.ventilator, self.sink):
                if core.exitcode is not None:
                    log.error("%s exited unexpectedly with code %s; stopping the server", core.name, core.exitcode)
                    return True
            self.pool.restart_exited(self.tell_ventilator)
            if self.gateway is not None and self.gateway.exitcode is not None:
                log.error("the HTTP gateway exited with code %s; restarting it", self.gateway.exitcode)
                self.start_gateway()
        log.info("stop requested; letting in-flight requests finish")
        return False

    def tell_ventilator(self, pid, exitcode):
        try:
            self.events.send(WorkerExited(pid, exitcode))
        except OSError:
            pass  # the ventilator is gone; watch() stops the server

    def stop_children(self):
        if self.gateway is not None and self.gateway.is_alive():
            self.gateway.terminate()  # it finishes its HTTP requests while the ventilator drains
        if self.ventilator is not None:
            stop_process(self.ventilator, self.settings.graceful_timeout + STOP_TIMEOUT)
        if self.sink is not None and self.sink.is_alive():
            self.sink.terminate()
        if self.pool is not None:
            self.pool.stop()
        for child in (self.sink, self.gateway):
            if child is not None:
                stop_process(child)
        if self.events is not None:
            self.events.close()


def run_gateway(settings):
    """The built-in HTTP gateway: a client of this server's own ports (with its own CURVE key)."""
    from .gateway import serve_http
    from .runtime import start_child

    start_child("gateway", settings.verbose)
    local = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "*") else settings.host
    raise SystemExit(serve_http(settings.http_host or settings.host, settings.http_port, local, settings.port,
                                settings.port_out, server_key=settings.server_key, client_key=settings.server_key,
                                api_key=settings.api_key, verbose=settings.verbose))
