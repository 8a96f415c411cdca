"""Warnings that a peer can cause, one line per kind every WARN_EVERY seconds: a client or
subscriber that sends bad messages in a loop must not fill the disk with the server's log. Each
line says how many of its kind were left out since the last one. Pure, but for the clock."""
import time
from collections import Counter

WARN_EVERY = 10


class QuietLog:
    def __init__(self, log, every=WARN_EVERY, clock=time.monotonic):
        self.log, self.every, self.clock = log, every, clock
        self.quiet_until = {}     # kind -> when a warning of that kind may be logged again
        self.left_out = Counter()  # kind -> warnings not logged since the last one logged

    def warning(self, kind, message, *args):
        """Log `message % args` as a warning unless one of `kind` was logged less than `every`
        seconds ago."""
        now = self.clock()
        if now < self.quiet_until.get(kind, float("-inf")):
            self.left_out[kind] += 1
            return
        self.quiet_until[kind] = now + self.every
        left_out = self.left_out.pop(kind, 0)
        note = f"; {left_out} more left out before this one" if left_out else ""
        self.log.warning(f"{message} (one such line per {self.every:g}s{note})", *args)
