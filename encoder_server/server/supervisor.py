"""Starts the ventilator, the sink and the workers, watches them, and stops them in order.

A worker that exits for any reason (kill -9, an exception, the OOM killer) is started again:
at once the first time, then after a pause that doubles while it keeps dying young. The
ventilator learns of each exit through a pipe and re-dispatches the dead worker's jobs; it tells
the supervisor in turn of a worker that stopped sending heartbeats, which is then killed and so
replaced. The ventilator and the sink hold every request's state: if one of them dies, it is
started again on the same ports and the requests it held fail with the `restarted` code, which
clients resend (`retries`); if they keep dying, the server stops with a non-zero exit, as it does
when every worker has failed to start MAX_FAILED_STARTS times in a row (the first error, one
line, says why: a model file that cannot load). With
--http-port it also runs the HTTP gateway, a client of its own ports, and with --metrics-port a
Prometheus exporter (the CLI hands it both), each restarted whenever it exits.

Stop order: the gateway and the ventilator drain first (in-flight requests finish, new ones are
refused), then the sink and workers stop, then the ipc folder is removed.
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
from dataclasses import replace
from multiprocessing.connection import wait
from pathlib import Path

from ..model.model_folder import ConfigError
from ..model.prepare import prepare_model_apart
from ..processes import reap_resource_tracker
from ..security import own_client_keys, workers_use_curve
from .messages import SinkRestarted, WorkerExited
from .placement import cpus_taken, describe, layout
from .sink import run_sink
from .sockets import Addresses, WorkerEndpoints
from .ventilator import run_ventilator
from .worker import worker_name
from .worker_pool import (MAX_FAILED_STARTS, STOP_TIMEOUT, WorkerPool, ask_to_stop, each_worker, start_process,
                          stop_process)

log = logging.getLogger("supervisor")
WATCH_INTERVAL = 0.2
MAX_CORE_DEATHS, CORE_DEATH_WINDOW = 3, 60.0
RUN_DIR_PREFIX = "es-"  # then the supervisor's pid and a random part (ipc paths must stay short)


def remove_stale_run_dirs():
    """Remove the ipc folders of servers killed before they could (kill -9 of a supervisor: its
    children die with it, see processes.start_child): those whose supervisor's pid is gone."""
    for path in Path(tempfile.gettempdir()).glob(f"{RUN_DIR_PREFIX}*-*"):
        pid = path.name[len(RUN_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and path.is_dir() and path.stat().st_uid == os.getuid() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's
    return True


def prepare_models(settings):
    """`settings` with every served model prepared (model.prepare: its ONNX file built or found)."""
    served = tuple(prepare_model_apart(model, verbose=settings.verbose) for model in settings.all_models)
    return replace(served[0], served=served)


def child_start_method(models):
    """How the supervisor starts its children. By fork, each starts from this process's imports
    instead of a fresh interpreter (a server's start costs about half the CPU, and its children share
    those pages). That is safe because this process runs no threads, holds no zmq context and loads
    neither torch nor onnxruntime (prepare_model_apart builds models in a spawned child), which a
    test checks. Not on cuda: there the launcher has asked torch whether a device is visible and how
    much memory it has (for the default worker count), which starts the CUDA driver in this process,
    and a forked child can then use no CUDA at all; spawned children start clean."""
    return "spawn" if any(model.device == "cuda" for model in models) else "fork"


def check_port_free(host, port):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise ConfigError(f"cannot listen on {host}:{port}: {error.strerror}") from None


def check_run_dir_fits():
    """ConfigError when TMPDIR is too long a path for the ipc sockets of a run folder in it."""
    would_be = os.path.join(tempfile.gettempdir(), f"{RUN_DIR_PREFIX}{os.getpid()}-{'x' * 8}")  # as mkdtemp names it
    too_long = Addresses("", 0, 0, would_be).ipc_too_long()
    if too_long:
        raise ConfigError(f"TMPDIR {tempfile.gettempdir()} is too long a path for the server's ipc sockets "
                          f"({too_long} passes the limit of Unix sockets): set a shorter TMPDIR")


class Supervisor:
    def __init__(self, settings, helpers=None):
        """`helpers`: the processes that serve this server over HTTP, name -> (the setting that asks
        for it, the function run in a child of its own with the settings), given by the CLI."""
        self.settings = settings
        self.helper_targets = helpers or {}
        self.stop_requested = threading.Event()
        self.context = multiprocessing.get_context(child_start_method(settings.all_models))
        self.addresses = None
        self.ventilator = None
        self.sink = None
        self.helpers = {}        # name -> Process: the gateway and the metrics exporter, when asked for
        self.pool = None
        self.placed = {}         # process name -> the CPUs it runs on (placement.py; empty: where the OS likes)
        self.events = None       # our end of the pipe to the ventilator
        self.core_deaths = []    # when the ventilator or the sink died, lately

    def serve(self):
        """Run until stopped; returns the process exit code."""
        for host, port in self.settings.listening():
            check_port_free(host, port)
        check_run_dir_fits()
        self.settings = prepare_models(self.settings)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self.stop_requested.set())
        remove_stale_run_dirs()
        run_dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
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
            reap_resource_tracker()
        log.info("stopped")
        return 1 if failed else 0

    def start_children(self):
        self.placed = self.placement() if self.settings.pin_cpus else {}
        if self.placed:
            log.info("processes pinned to CPUs: %s", describe(self.placed))
        self.start_sink()
        curve = own_client_keys(self.settings) if workers_use_curve(self.settings) else None
        endpoints = WorkerEndpoints(self.addresses.backend, self.addresses.sink, curve)
        self.pool = WorkerPool(self.context, self.settings.all_models, endpoints, placed=self.placed)
        self.start_ventilator()
        for name, (port_setting, _) in self.helper_targets.items():
            if getattr(self.settings, port_setting):
                self.start_helper(name)

    def placement(self):
        """Each process's CPUs (placement.layout) over the CPUs this server may use."""
        cpus = os.sched_getaffinity(0)
        models = each_worker(self.settings.all_models)
        return layout(cpus, {worker_name(index): cpus_taken(model, len(models), len(cpus))
                             for index, model in enumerate(models)}, offset=self.settings.port)

    def start_sink(self):
        self.sink = start_process(self.context, run_sink, "sink", self.settings, self.addresses,
                                  self.placed.get("sink"))
        log.info("sink started (pid %d)", self.sink.pid)

    def start_ventilator(self):
        if self.events is not None:
            self.events.close()
        self.events, theirs = self.context.Pipe()
        self.ventilator = start_process(self.context, run_ventilator, "ventilator", self.settings, self.addresses,
                                        theirs, self.placed.get("ventilator"))
        theirs.close()
        log.info("ventilator started (pid %d)", self.ventilator.pid)

    def start_helper(self, name):
        self.helpers[name] = start_process(self.context, self.helper_targets[name][1], name, self.settings)

    def watch(self):
        """Keep workers and the helpers running until a stop signal, or until the ventilator or
        sink exits or no worker can start; True if that exit was a failure."""
        while not self.stop_requested.is_set():
            wait([self.ventilator.sentinel, self.sink.sentinel, self.events, *self.pool.sentinels,
                  *(helper.sentinel for helper in self.helpers.values())], timeout=WATCH_INTERVAL)
            try:
                while self.events.poll():
                    self.pool.kill(self.events.recv().pid)  # messages.WorkerSilent
            except EOFError:  # the ventilator has gone
                self.ventilator.join(STOP_TIMEOUT)
            # each exit code read once: a ventilator exiting between two reads would look alive to
            # the first and dead to the second, and be restarted though it had drained
            ventilator_exit, sink_exit = self.ventilator.exitcode, self.sink.exitcode
            if ventilator_exit == 0:
                return False  # drained after a TERMINATION request
            for core, exitcode in ((self.ventilator, ventilator_exit), (self.sink, sink_exit)):
                if exitcode is not None and not self.restart_core(core):
                    return True
            self.pool.restart_exited(lambda pid, exitcode: self.tell_ventilator(WorkerExited(pid, exitcode)))
            start_error = self.pool.cannot_start()
            if start_error is not None:
                log.error("workers cannot start (each failed %d times in a row); stopping the server: %s",
                          MAX_FAILED_STARTS, start_error)
                return True
            for name, helper in list(self.helpers.items()):
                if helper.exitcode is not None:
                    log.error("the %s process exited with code %s; restarting it", name, helper.exitcode)
                    self.start_helper(name)
        log.info("stop requested; letting in-flight requests finish")
        return False

    def restart_core(self, core):
        """Start a ventilator or sink that died again in place, on the same ports, so that clients
        see one failed request (which `retries` resend) and nothing more; False (stop the server)
        once they have died MAX_CORE_DEATHS times within CORE_DEATH_WINDOW seconds."""
        now = time.monotonic()
        self.core_deaths = [death for death in self.core_deaths if now - death < CORE_DEATH_WINDOW] + [now]
        if len(self.core_deaths) > MAX_CORE_DEATHS:
            log.error("%s exited with code %s: the ventilator and the sink died %d times in %.0fs; stopping the "
                      "server", core.name, core.exitcode, len(self.core_deaths), CORE_DEATH_WINDOW)
            return False
        log.error("%s exited unexpectedly with code %s; restarting it", core.name, core.exitcode)
        if core is self.sink:
            self.tell_ventilator(SinkRestarted())  # before the new sink can take any new request
            self.start_sink()
        else:
            self.start_ventilator()
        return True

    def tell_ventilator(self, message):
        try:
            self.events.send(message)
        except OSError:
            pass  # the ventilator is gone; watch() restarts it

    def stop_children(self):
        for helper in self.helpers.values():
            ask_to_stop(helper)  # the gateway finishes its HTTP requests while the ventilator drains
        if self.ventilator is not None:
            stop_process(self.ventilator, self.settings.drain_timeout + STOP_TIMEOUT)
        if self.sink is not None:
            ask_to_stop(self.sink)
        if self.pool is not None:
            self.pool.stop()
        for child in (self.sink, *self.helpers.values()):
            if child is not None:
                stop_process(child)
        if self.events is not None:
            self.events.close()
