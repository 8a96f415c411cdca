"""Worker processes kept running: one that exits for any reason (kill -9, an exception, the OOM
killer) is started again, at once the first time, then after a pause that doubles while it keeps
dying young. Used by the server's supervisor and by `encoder-server worker` on other hosts.
"""
import logging
import os
import signal
import time
from collections import Counter

from .runtime import STOP_SIGNAL
from .worker import run_worker

log = logging.getLogger("supervisor")
STOP_TIMEOUT = 10.0
MAX_RESTART_PAUSE = 10.0
STABLE_AFTER = 30.0  # a worker that lived this long starts its restart pauses afresh


def restart_pause(quick_deaths):
    """Seconds to wait before restarting a worker that died young `quick_deaths` times in a row."""
    return 0.0 if quick_deaths <= 1 else min(0.5 * 2 ** (quick_deaths - 2), MAX_RESTART_PAUSE)


def start_process(spawn, target, name, *args):
    """Start a child; it inherits ignored SIGINT and SIGTERM through spawn's exec, so that a signal
    to the whole process group is the supervisor's alone to act on (see runtime.start_child)."""
    process = spawn.Process(target=target, args=args, name=name)
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


class WorkerPool:
    def __init__(self, spawn, settings, endpoints, count, remote=False):
        self.spawn, self.settings, self.endpoints, self.remote = spawn, settings, endpoints, remote
        self.workers = {}        # index -> Process
        self.started_at = {}     # index -> monotonic start time
        self.restart_at = {}     # index -> when to start a dead worker again
        self.quick_deaths = Counter()
        for index in range(count):
            self.start(index)

    def start(self, index):
        self.workers[index] = start_process(self.spawn, run_worker, f"worker-{index}", self.settings,
                                            self.endpoints, index, self.remote)
        self.started_at[index] = time.monotonic()

    @property
    def sentinels(self):
        return [worker.sentinel for worker in self.workers.values()]

    def restart_exited(self, on_exit=None):
        """Schedule each newly exited worker's restart (calling `on_exit(pid, exitcode)`), and
        start those whose pause is over."""
        now = time.monotonic()
        for index, worker in self.workers.items():
            if worker.exitcode is None or index in self.restart_at:
                continue
            young = now - self.started_at[index] < STABLE_AFTER
            self.quick_deaths[index] = self.quick_deaths[index] + 1 if young else 1
            pause = restart_pause(self.quick_deaths[index])
            log.error("%s (pid %d) exited with code %s; restarting it in %.1fs", worker.name, worker.pid,
                      worker.exitcode, pause)
            if on_exit is not None:
                on_exit(worker.pid, worker.exitcode)
            self.restart_at[index] = now + pause
        for index in [index for index, due in self.restart_at.items() if due <= now]:
            del self.restart_at[index]
            self.start(index)

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
