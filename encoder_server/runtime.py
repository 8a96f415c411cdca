"""What every server process does first: logging, signals, addresses."""
import ctypes
import logging
import multiprocessing
import os
import signal
import threading
from dataclasses import dataclass

import zmq

from encoder_client.keys import apply_curve

POLL_MS = 100
# messages queued per socket peer; the dispatcher keeps far fewer jobs per worker than this
INTERNAL_HWM = 10000


@dataclass(frozen=True)
class WorkerEndpoints:
    """Where a worker takes jobs and sends results; `curve` is (server public, own public, own
    secret) when those ports use CURVE (a server with --server-key and --worker-port)."""
    jobs: str
    results: str
    curve: tuple = None


@dataclass(frozen=True)
class Addresses:
    """Public tcp endpoints plus the ipc endpoints inside the server (under `run_dir`), and with
    `worker_port` two more tcp ports for workers on other hosts: jobs on it, results on the next."""
    host: str
    port: int
    port_out: int
    run_dir: str
    worker_port: int = None

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

    @property
    def jobs_binds(self):
        return [self.backend, *self._remote(0)]

    @property
    def results_binds(self):
        return [self.sink, *self._remote(1)]

    def _remote(self, offset):
        return [f"tcp://{self.host}:{self.worker_port + offset}"] if self.worker_port else []


def remote_worker_endpoints(host, worker_port, curve=None):
    return WorkerEndpoints(f"tcp://{host}:{worker_port}", f"tcp://{host}:{worker_port + 1}", curve)


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
    _stop_with_parent(stop)
    return configure_logging(name, verbose), stop


def _stop_with_parent(stop):
    """Have Linux send us SIGTERM when the supervisor dies, even by kill -9, so no child is orphaned."""
    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: the supervisor's orderly stop still applies
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        stop.set()  # it died before we asked


def make_socket(context, kind, bind=None, connect=None, identity=None, hwm=INTERNAL_HWM, curve=None, options=None,
                curve_client=None):
    """A socket whose queues are bounded by `hwm` messages per peer, bound to one endpoint or a
    list, or connected. `curve` is the server's (public, secret) key pair when peers must use
    CURVE; `curve_client` is (server public, own public, own secret) to connect to such a peer;
    `options` are more socket options."""
    sock = context.socket(kind)
    for option, value in (options or {}).items():
        sock.setsockopt(option, value)
    if identity:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    if curve:
        sock.curve_publickey, sock.curve_secretkey = curve
        sock.curve_server = True
    apply_curve(sock, curve_client)
    for endpoint in [bind] if isinstance(bind, str) else bind or []:
        sock.bind(endpoint)
    if connect:
        sock.connect(connect)
    return sock
