"""The server's processes: what every child of the supervisor does first (logging, signals, dying
with its parent), and what a process that spawned children does last (reaping the resource tracker)."""
import ctypes
import multiprocessing
import os
import signal
import threading

from .logs import configure_logging

# how the supervisor asks a child to stop; children ignore SIGINT and SIGTERM, which a Ctrl-C, systemd
# or `kill -- -PGID` send to the whole process group, and leave the order of shutdown to the supervisor
STOP_SIGNAL = signal.SIGUSR1


def start_child(name, verbose, cpus=None):
    """Set up a child process; returns (log, stop) where `stop` is set by STOP_SIGNAL. With `cpus`,
    it runs on those CPUs only, and so do the threads it starts later (server/placement.py)."""
    if cpus:
        os.sched_setaffinity(0, cpus)  # first: every thread started from here on inherits it
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, lambda *_: stop.set())
    _die_with_parent()
    _name_process(name)
    return configure_logging(name, verbose), stop


def reap_resource_tracker():
    """Stop multiprocessing's resource tracker, which the first spawned process started (a remote
    worker's workers, the supervisor's model preparation), and wait for it: once every child has
    stopped it has nothing left to track, and left alone it would outlive us as an orphan for init
    to reap (a leftover of the process group for a moment or more)."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)  # CPython 3.8 and later
    if stop is not None:
        stop()


def _name_process(name):
    """Show `name` (its last 15 bytes, Linux's limit) for this process in ps, top and /proc/PID/comm,
    where every child of the supervisor would otherwise be one more "python"."""
    pr_set_name = 15
    try:
        ctypes.CDLL(None).prctl(pr_set_name, name.encode()[-15:])
    except (OSError, AttributeError):
        pass  # not Linux: a cosmetic loss


def _die_with_parent():
    """Have Linux kill us when the supervisor dies, even by kill -9: a child that outlived it would
    hold the ports, and a process manager's restart would fail with "address already in use"."""
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the supervisor's orderly stop still applies
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os._exit(1)  # it died before we asked
