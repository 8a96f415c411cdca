"""What every server process does first: logging, signals, addresses."""
import logging
import os
import signal
import threading
from dataclasses import dataclass

import zmq

POLL_MS = 100


@dataclass(frozen=True)
class Addresses:
    """Public tcp endpoints plus the ipc endpoints inside the server (under `run_dir`)."""
    host: str
    port: int
    port_out: int
    run_dir: str

    @property
    def frontend(self):
        return f"tcp://{self.host}:{self.port}"

    @property
    def publish(self):
        return f"tcp://{self.host}:{self.port_out}"

    @property
    def backend(self):
        return f"ipc://{self.run_dir}/backend"

    @property
    def sink(self):
        return f"ipc://{self.run_dir}/sink"

    @property
    def feedback(self):
        return f"ipc://{self.run_dir}/feedback"


def configure_logging(name, verbose):
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format=f"%(asctime)s {name:>10} %(levelname)s %(message)s", force=True)
    return logging.getLogger(name)


def start_child(name, verbose):
    """Set up a child process; returns (log, stop) where `stop` is set by SIGTERM.

    Children ignore SIGINT: a Ctrl-C reaches the whole process group, and the supervisor alone
    decides the order of shutdown.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return configure_logging(name, verbose), stop


def make_socket(context, kind, bind=None, connect=None, identity=None):
    """A socket for traffic inside the server. Queues are unbounded for now (no high-water mark)."""
    sock = context.socket(kind)
    if identity:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if bind:
        sock.bind(bind)
    else:
        sock.connect(connect)
    return sock
