"""Test-only faults, inert unless the worker's environment has ENCODER_SERVER_FAULTS=1.

With it, a text starting with "!crash" kills the worker that receives it, as a segfault in the
model would, and "!sleep SECONDS" holds the thread that tokenizes it for that long: the worker's
intake for a small request, else its prefetch.
"""
import os
import signal
import time

ENABLED = os.environ.get("ENCODER_SERVER_FAULTS") == "1"


def inject(texts):
    if not ENABLED:
        return
    for text in texts:
        if not isinstance(text, str):
            continue
        if text.startswith("!crash"):
            os.kill(os.getpid(), signal.SIGKILL)
        if text.startswith("!sleep "):
            time.sleep(float(text.split()[1]))
