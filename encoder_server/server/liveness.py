"""Which workers are alive, as the ventilator sees them. Pure: no sockets, time passed in.

The ZeroMQ Guide's Paranoid Pirate (its ppqueue.py keeps the same books in WorkerQueue): a
worker says READY when it connects, then sends a heartbeat every `interval`, and the ventilator
sends one back at the same rate. A worker is lost when it has been silent for `liveness`
intervals, when the supervisor reports that it exited, when it cannot be reached, or when it says
READY again (it lost touch with us and connected anew: its jobs go to others, but do not count
as having crashed it). Silence while the ventilator itself was stalled does not count. Each loss
says which worker, why, and its pid when the local supervisor runs it; the ventilator then gives
its jobs to others, and has the supervisor kill a local worker that fell silent, since it may
still be running. A worker that sent what no worker of ours sends is kept out for
KEEP_OUT_SECONDS: it gets no jobs, even if it says READY again (a restarted local worker has a
new name).
"""
import os
from collections import OrderedDict
from dataclasses import dataclass

# seconds between heartbeats, both ways; the tests of liveness shorten it through this variable
# (every process of a server must read the same value), so that they need not wait out 5 s windows
HEARTBEAT_VARIABLE = "ENCODER_SERVER_HEARTBEAT_INTERVAL"


def _interval(value):
    try:
        seconds = float(value)
    except ValueError:
        raise SystemExit(f"{HEARTBEAT_VARIABLE}={value!r}: not a number of seconds") from None
    if not 0.05 <= seconds <= 60:
        raise SystemExit(f"{HEARTBEAT_VARIABLE}={value!r}: use 0.05 to 60 seconds")
    return seconds


HEARTBEAT_INTERVAL = _interval(os.environ.get(HEARTBEAT_VARIABLE, "1.0"))
HEARTBEAT_LIVENESS = 5   # intervals without a word from a worker before it counts as dead
KEEP_OUT_SECONDS = 60.0
KEPT_OUT_LIMIT = 10_000  # workers remembered as kept out; the oldest are forgotten first


@dataclass(frozen=True)
class Loss:
    worker: bytes
    why: str
    pid: int = None       # set for a worker that the local supervisor runs
    kill: bool = False    # it may still be running: have the supervisor kill it
    crashed: bool = True  # False when the same process connected again: no sign its jobs harm workers


class Liveness:
    def __init__(self, hostname, interval=HEARTBEAT_INTERVAL, liveness=HEARTBEAT_LIVENESS):
        self.hostname = hostname
        self.interval = interval
        self.silence = interval * liveness
        self.restarts = 0       # local worker exits the supervisor reported (it restarts each one)
        self._heard = {}        # worker -> when we last heard from it
        self._pids = {}         # worker -> pid, for the workers the local supervisor runs
        self._kept_out = OrderedDict()  # worker -> until when it gets no jobs
        self._next_beat = 0.0

    def ready(self, worker, info, now, over_ipc):
        """A worker said READY (info: messages.Ready); returns the loss of its old self, if any. It is
        one the local supervisor runs when it says so and came `over_ipc`, which only a process of
        this host that can reach the server's folder can: a peer on the worker port that claimed a
        local worker's pid could otherwise have it killed."""
        losses = [self._lose(worker, "connected again", crashed=False)] if worker in self._heard else []
        self._heard[worker] = now
        if over_ipc and not info.remote and info.host == self.hostname:
            self._pids[worker] = info.pid
        return losses

    def heard(self, worker, now):
        """Note a message from `worker`; False when it was given up for dead (ignore what it says)."""
        if worker not in self._heard:
            return False
        self._heard[worker] = now
        return True

    def silent(self, now):
        """The losses of the workers silent for too long at `now`."""
        cutoff = now - self.silence
        return [self._lose(worker, "stopped sending heartbeats", kill=True)
                for worker, heard in list(self._heard.items()) if heard < cutoff]

    def stalled(self, seconds):
        """The ventilator itself did not run for `seconds` (a long parse, a swapping host): the
        silence of its workers over that time says nothing about them, so it does not count."""
        for worker in self._heard:
            self._heard[worker] += seconds

    def exited(self, pid, exitcode):
        """The supervisor saw local process `pid` exit (and restarts it)."""
        self.restarts += 1
        worker = next((worker for worker, known in self._pids.items() if known == pid), None)
        return [self._lose(worker, f"exited with code {exitcode}")] if worker is not None else []

    def unreachable(self, worker):
        return [self._lose(worker, "cannot be reached")] if worker in self._heard else []

    def misbehaved(self, worker, now, why="sent a malformed message"):
        """It sent what no worker of ours sends: forget it and keep it out for a while. A remote
        worker's jobs are no sign that they harm workers (the worker is at fault), so they do not
        count as crashes. A local one runs this server's code, so a job may have caused it (rows not
        as wide as its model declares): its jobs count as crashed, as when a worker dies, and one
        that fails on every worker fails its request instead of going round for ever."""
        self._kept_out[worker] = now + KEEP_OUT_SECONDS
        self._kept_out.move_to_end(worker)
        if len(self._kept_out) > KEPT_OUT_LIMIT:
            self._kept_out.popitem(last=False)
        return [self._lose(worker, why, kill=True, crashed=worker in self._pids)] if worker in self._heard else []

    def kept_out(self, worker, now):
        """Whether `worker` misbehaved lately: whatever it sends is ignored."""
        until = self._kept_out.get(worker)
        if until is not None and until <= now:
            del self._kept_out[worker]
            return False
        return until is not None

    def is_local(self, worker):
        """Whether the local supervisor runs `worker` (it talks to us over ipc)."""
        return worker in self._pids

    def beat_due(self, now):
        """The workers to send a heartbeat to at `now`: all of them, once per interval."""
        if now < self._next_beat:
            return []
        self._next_beat = now + self.interval
        return list(self._heard)

    @property
    def local(self):
        return len(self._pids)

    def __len__(self):
        return len(self._heard)

    def _lose(self, worker, why, kill=False, crashed=True):
        self._heard.pop(worker, None)
        return Loss(worker, why, self._pids.pop(worker, None), kill, crashed)
