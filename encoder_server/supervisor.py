"""Starts the ventilator, the sink and the workers, watches them, and stops them in order.

A worker that exits for any reason (kill -9, an exception, the OOM killer) is started again:
at once the first time, then after a pause that doubles while it keeps dying young. The
ventilator learns of each exit through a pipe and re-dispatches the dead worker's jobs; it tells
the supervisor in turn of a worker that stopped sending heartbeats, which is then killed and so
replaced. The ventilator and the sink hold every request's state: if one of them dies, the server
stops with a non-zero exit, never silently.

Stop order: the ventilator drains first (in-flight requests finish, new ones are refused),
then the sink and workers stop, then the ipc folder is removed.
"""
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections import Counter
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
MAX_RESTART_PAUSE = 10.0
STABLE_AFTER = 30.0  # a worker that lived this long starts its restart pauses afresh


def check_port_free(host, port):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror}") from None


def restart_pause(quick_deaths):
    """Seconds to wait before restarting a worker that died young `quick_deaths` times in a row."""
    return 0.0 if quick_deaths <= 1 else min(0.5 * 2 ** (quick_deaths - 2), MAX_RESTART_PAUSE)


class Supervisor:
    def __init__(self, settings):
        self.settings = settings
        self.stop_requested = threading.Event()
        self.spawn = multiprocessing.get_context("spawn")
        self.addresses = None
        self.ventilator = None
        self.sink = None
        self.events = None       # our end of the pipe to the ventilator
        self.workers = {}        # index -> Process
        self.started_at = {}     # index -> monotonic start time
        self.restart_at = {}     # index -> when to start a dead worker again
        self.quick_deaths = Counter()

    def serve(self):
        """Run until stopped; returns the process exit code."""
        for port in (self.settings.port, self.settings.port_out):
            check_port_free(self.settings.host, port)
        self.settings = prepare_model(self.settings)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.stop_requested.set())
        run_dir = tempfile.mkdtemp(prefix="encoder-server-")
        try:
            self.addresses = Addresses(self.settings.host, self.settings.port, self.settings.port_out, run_dir)
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
        self.sink = self._start(run_sink, "sink", self.settings, self.addresses)
        for index in range(self.settings.num_worker):
            self.start_worker(index)
        self.ventilator = self._start(run_ventilator, "ventilator", self.settings, self.addresses, theirs)
        theirs.close()

    def start_worker(self, index):
        self.workers[index] = self._start(run_worker, f"worker-{index}", self.settings, self.addresses, index)
        self.started_at[index] = time.monotonic()

    def _start(self, target, name, *args):
        process = self.spawn.Process(target=target, args=args, name=name)
        # children inherit an ignored SIGINT through spawn's exec; Ctrl-C is the supervisor's alone
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, previous)
        return process

    def watch(self):
        """Keep workers running until a stop signal, or until the ventilator or sink exits;
        True if that exit was a failure."""
        while not self.stop_requested.is_set():
            wait([self.ventilator.sentinel, self.sink.sentinel, self.events,
                  *(worker.sentinel for worker in self.workers.values())], timeout=WATCH_INTERVAL)
            try:
                while self.events.poll():
                    self.kill_silent(self.events.recv()[1])
            except EOFError:  # the ventilator has gone
                self.ventilator.join(STOP_TIMEOUT)
            if self.ventilator.exitcode == 0:
                return False  # drained after a TERMINATION request
            for core in (self.ventilator, self.sink):
                if core.exitcode is not None:
                    log.error("%s exited unexpectedly with code %s; stopping the server", core.name, core.exitcode)
                    return True
            self.restart_workers()
        log.info("stop requested; letting in-flight requests finish")
        return False

    def kill_silent(self, pid):
        for worker in self.workers.values():
            if worker.pid == pid and worker.exitcode is None:
                log.error("%s (pid %d) stopped sending heartbeats; killing it", worker.name, pid)
                os.kill(pid, signal.SIGKILL)

    def restart_workers(self):
        now = time.monotonic()
        for index, worker in self.workers.items():
            if worker.exitcode is None or index in self.restart_at:
                continue
            young = now - self.started_at[index] < STABLE_AFTER
            self.quick_deaths[index] = self.quick_deaths[index] + 1 if young else 1
            pause = restart_pause(self.quick_deaths[index])
            log.error("%s (pid %d) exited with code %s; restarting it in %.1fs", worker.name, worker.pid,
                      worker.exitcode, pause)
            try:
                self.events.send(("exited", worker.pid, worker.exitcode))
            except OSError:
                pass  # the ventilator is gone; watch() stops the server
            self.restart_at[index] = now + pause
        for index in [index for index, due in self.restart_at.items() if due <= now]:
            del self.restart_at[index]
            self.start_worker(index)

    def stop_children(self):
        if self.ventilator is not None:
            _stop(self.ventilator, self.settings.graceful_timeout + STOP_TIMEOUT)
        others = [process for process in (self.sink, *self.workers.values()) if process is not None]
        for child in others:
            if child.is_alive():
                child.terminate()
        for child in others:
            _stop(child, STOP_TIMEOUT)
        if self.events is not None:
            self.events.close()


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
