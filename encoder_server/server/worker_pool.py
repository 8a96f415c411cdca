"""Worker processes kept running: one that exits for any reason (kill -9, an exception, the OOM
killer) is started again, at once the first time, then after a pause that doubles while it keeps
dying young. Used by the server's supervisor and by `encoder-server worker` on other hosts.

Each worker says on a pipe whether its model loaded, or the error (one line) that stopped it.
Once every worker has failed to start MAX_FAILED_STARTS times in a row, `cannot_start` gives
the first of those errors, and the pool's owner stops: restarting them further cannot help.
"""
import logging
import os
import signal
import time
from collections import Counter

from ..processes import STOP_SIGNAL
from .worker import run_worker, worker_name

log = logging.getLogger("supervisor")
STOP_TIMEOUT = 10.0
MAX_RESTART_PAUSE = 10.0
STABLE_AFTER = 30.0  # a worker that lived this long starts its restart pauses afresh
MAX_FAILED_STARTS = 3  # start-up failures in a row, of every worker, after which the pool gives up


def restart_pause(quick_deaths):
    """Seconds to wait before restarting a worker that died young `quick_deaths` times in a row."""
    return 0.0 if quick_deaths <= 1 else min(0.5 * 2 ** (quick_deaths - 2), MAX_RESTART_PAUSE)


def start_process(context, target, name, *args):
    """Start a child in a multiprocessing `context`; it inherits ignored SIGINT and SIGTERM, so that a
    signal to the whole process group is the supervisor's alone to act on (see processes.start_child)."""
    process = context.Process(target=target, args=args, name=name)
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        process.start()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return process


def ask_to_stop(process):
    if process.pid is not None and process.is_alive():
        os.kill(process.pid, STOP_SIGNAL)


def stop_process(process, timeout=STOP_TIMEOUT):
    if process.pid is None:
        return  # never started
    ask_to_stop(process)
    process.join(timeout)
    if process.is_alive():
        log.error("%s did not stop within %.0fs; killing it", process.name, timeout)
        process.kill()
        process.join()


def each_worker(models):
    """The Settings of each worker of `models` (each served model's num_worker), by worker index."""
    return [model for model in models for _ in range(model.num_worker)]


class WorkerPool:
    def __init__(self, context, models, endpoints, remote=False, placed=None):
        """`models`: each served model's Settings, whose num_worker workers the pool runs (numbered on
        across the models, in order). `placed`: the CPUs of each worker that has its own, by name
        (placement.layout)."""
        self.context, self.endpoints, self.remote = context, endpoints, remote
        self.settings_of = each_worker(models)  # index -> Settings
        self.placed = placed or {}
        self.workers = {}        # index -> Process
        self.started_at = {}     # index -> monotonic start time
        self.restart_at = {}     # index -> when to start a dead worker again
        self.quick_deaths = Counter()
        self.reports = {}        # index -> our end of the pipe on which a starting worker reports
        self.start_errors = {}   # index -> why its worker could not start, once it said so
        self.failed_starts = Counter()  # index -> start-ups failed in a row
        self.first_error = None  # the first start-up error since a worker last started
        for index in range(len(self.settings_of)):
            self.start(index)

    def start(self, index):
        self.reports[index], theirs = self.context.Pipe(duplex=False)
        name = worker_name(index)
        self.workers[index] = start_process(self.context, run_worker, name, self.settings_of[index], self.endpoints,
                                            index, self.remote, len(self.settings_of) == 1, theirs,
                                            self.placed.get(name))
        theirs.close()
        self.started_at[index] = time.monotonic()

    @property
    def sentinels(self):
        return [worker.sentinel for worker in self.workers.values()]

    def restart_exited(self, on_exit=None):
        """Schedule each newly exited worker's restart (calling `on_exit(pid, exitcode)`), and
        start those whose pause is over."""
        now = time.monotonic()
        self.read_reports()
        for index, worker in self.workers.items():
            if worker.exitcode is None or index in self.restart_at:
                continue
            young = now - self.started_at[index] < STABLE_AFTER
            self.quick_deaths[index] = self.quick_deaths[index] + 1 if young else 1
            pause = restart_pause(self.quick_deaths[index])
            error = self.start_error(index)
            if error is None:
                log.error("%s (pid %d) exited with code %s; restarting it in %.1fs", worker.name, worker.pid,
                          worker.exitcode, pause)
            else:
                log.error("%s (pid %d) could not start (%d time(s) in a row): %s; restarting it in %.1fs",
                          worker.name, worker.pid, self.failed_starts[index], error, pause)
            if on_exit is not None:
                on_exit(worker.pid, worker.exitcode)
            self.restart_at[index] = now + pause
        for index in [index for index, due in self.restart_at.items() if due <= now]:
            del self.restart_at[index]
            self.start(index)

    def read_reports(self):
        """Take what starting workers said: that one serves (its failures in a row end), or why it could
        not start. A pipe at its end with nothing said is left for `start_error` once the exit is seen."""
        for index in list(self.reports):
            reports = self.reports[index]
            if not reports.poll():
                continue
            try:
                error = reports.recv()
            except EOFError:
                continue
            reports.close()
            del self.reports[index]
            if error is None:
                self.failed_starts[index], self.first_error = 0, None
            else:
                self.start_errors[index] = error

    def start_error(self, index):
        """Why the exited worker `index` never became ready, counted as a failed start; None if it had."""
        self.read_reports()  # it may have said why just before its exit was seen
        if index in self.reports:  # it exited without a word (killed, or a crash below Python)
            self.reports.pop(index).close()
            self.start_errors[index] = f"exited with code {self.workers[index].exitcode} before it was ready"
        error = self.start_errors.pop(index, None)
        if error is not None:
            self.failed_starts[index] += 1
            self.first_error = self.first_error or f"{self.workers[index].name}: {error}"
        return error

    def cannot_start(self):
        """The first start-up error, once every worker has failed to start MAX_FAILED_STARTS times in a
        row (none serves); None while any may yet start."""
        if all(self.failed_starts[index] >= MAX_FAILED_STARTS for index in self.workers):
            return self.first_error
        return None

    def kill(self, pid):
        for worker in self.workers.values():
            if worker.pid == pid and worker.exitcode is None:
                log.error("%s (pid %d) stopped sending heartbeats; killing it", worker.name, pid)
                os.kill(pid, signal.SIGKILL)

    def stop(self):
        for worker in self.workers.values():
            ask_to_stop(worker)
        for worker in self.workers.values():
            stop_process(worker)
        for reports in self.reports.values():
            reports.close()
