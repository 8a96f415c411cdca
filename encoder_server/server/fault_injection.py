"""Test-only faults, inert unless the worker's environment has ENCODER_SERVER_FAULTS=1.

With it, a text starting with "!crash" kills the worker that receives it, as a segfault in the
model would, and "!sleep SECONDS" holds the thread that tokenizes it for that long: the worker's
intake for a small request, else its prefetch; "!badpart" makes the rows of its job one value
wide, which the sink refuses, as it would a model's rows that are not the width it declares.
"""
import os
import signal
import time

import numpy as np

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


def garbled(rows, texts):
    """`rows`, or with a text starting with "!badpart", rows the sink cannot use."""
    if ENABLED and any(isinstance(text, str) and text.startswith("!badpart") for text in texts):
        return np.zeros((len(rows), 1), np.float32)
    return rows
