"""Starts the ventilator, the sink and the workers, watches them, and stops them in order.

Stop order: the ventilator drains first (in-flight requests finish, new ones are refused),
then the sink and workers stop, then the ipc folder is removed. A child that dies unexpectedly
is reported and brings the server down with a non-zero exit, never silently.
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
from .model_folder import ConfigError
from .runtime import Addresses
from .sink import run_sink
from .ventilator import run_ventilator
from .worker import run_worker

log = logging.getLogger("supervisor")
WATCH_INTERVAL = 0.2
STOP_TIMEOUT = 10.0


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
        self.ventilator = None
        self.others = []

    def serve(self):
        """Run until stopped; returns the process exit code."""
        for port in (self.settings.port, self.settings.port_out):
            check_port_free(self.settings.host, port)
        self.settings = prepare_model(self.settings)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.stop_requested.set())
        run_dir = tempfile.mkdtemp(prefix="encoder-server-")
        try:
            self.start_children(Addresses(self.settings.host, self.settings.port, self.settings.port_out, run_dir))
            log.info("listening on %s:%d (requests) and %s:%d (results)", self.settings.host, self.settings.port,
                     self.settings.host, self.settings.port_out)
            failed = self.watch()
        finally:
            self.stop_children()
            shutil.rmtree(run_dir, ignore_errors=True)
        log.info("stopped")
        return 1 if failed else 0

    def start_children(self, addresses):
        spawn = multiprocessing.get_context("spawn")
        # children inherit an ignored SIGINT through spawn's exec; Ctrl-C is the supervisor's alone
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            self.others.append(spawn.Process(target=run_sink, args=(self.settings, addresses), name="sink"))
            self.others += [spawn.Process(target=run_worker, args=(self.settings, addresses, i), name=f"worker-{i}")
                            for i in range(self.settings.num_worker)]
            self.ventilator = spawn.Process(target=run_ventilator, args=(self.settings, addresses), name="ventilator")
            for process in (*self.others, self.ventilator):
                process.start()
        finally:
            signal.signal(signal.SIGINT, previous)

    def watch(self):
        """Wait for a stop signal or a child's exit; True if a child failed."""
        children = [self.ventilator, *self.others]
        while not self.stop_requested.is_set():
            wait([child.sentinel for child in children], timeout=WATCH_INTERVAL)
            exited = [child for child in children if child.exitcode is not None]
            if exited == [self.ventilator] and self.ventilator.exitcode == 0:
                return False  # drained after a TERMINATION request
            if exited:
                for child in exited:
                    log.error("%s exited unexpectedly with code %s; stopping the server", child.name, child.exitcode)
                return True
        log.info("stop requested; letting in-flight requests finish")
        return False

    def stop_children(self):
        if self.ventilator is not None:
            _stop(self.ventilator, self.settings.graceful_timeout + STOP_TIMEOUT)
        for child in self.others:
            if child.is_alive():
                child.terminate()
        for child in self.others:
            _stop(child, STOP_TIMEOUT)


def _stop(process, timeout):
    if process.pid is None:
        return  # never started
    if process.is_alive():
        process.terminate()
    process.join(timeout)
    if process.is_alive():
        log.error("%s did not stop within %.0fs; killing it", process.name, timeout)
        process.kill()
        process.join()
