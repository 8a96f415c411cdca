"""What every server process does first: logging, signals, addresses."""
import ctypes
import json
import logging
import multiprocessing
import os
import signal
import threading
from dataclasses import dataclass

import zmq

from encoder_client.keys import apply_curve

POLL_MS = 100
LOG_FORMAT_VARIABLE = "ENCODER_SERVER_LOG_FORMAT"
# how the supervisor asks a child to stop; children ignore SIGINT and SIGTERM, which a Ctrl-C, systemd
# or `kill -- -PGID` send to the whole process group, and leave the order of shutdown to the supervisor
STOP_SIGNAL = signal.SIGUSR1
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
    def control(self):
        return f"ipc://{self.run_dir}/control"

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


def local_address(host):
    """How a process on this host reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "*") else host


def peer_address(frame):
    """The address a received frame's sender connected from (None for ipc, or when unknown)."""
    try:
        return frame.get("Peer-Address")
    except zmq.ZMQError:
        return None


def user_id(frame):
    """The CURVE client key (its ZAP user id) a received frame came with; None without CURVE."""
    try:
        return frame.get("User-Id") or None
    except zmq.ZMQError:
        return None


def remote_worker_endpoints(host, worker_port, curve=None):
    return WorkerEndpoints(f"tcp://{host}:{worker_port}", f"tcp://{host}:{worker_port + 1}", curve)


def configure_logging(name, verbose):
    """Log to stderr as text, or as one JSON object per line when ENCODER_SERVER_LOG_FORMAT=json
    (`--log-format json`, which the supervisor passes on to its children this way)."""
    handler = logging.StreamHandler()
    json_lines = os.environ.get(LOG_FORMAT_VARIABLE) == "json"
    handler.setFormatter(JsonLines(name) if json_lines else
                         logging.Formatter(f"%(asctime)s {name:>10} %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler], force=True)
    return logging.getLogger(name)


class JsonLines(logging.Formatter):
    def __init__(self, process_name):
        super().__init__()
        self.process_name = process_name

    def format(self, record):
        entry = {"time": self.formatTime(record), "process": self.process_name, "pid": record.process,
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def start_child(name, verbose):
    """Set up a child process; returns (log, stop) where `stop` is set by STOP_SIGNAL."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(STOP_SIGNAL, lambda *_: stop.set())
    _die_with_parent()
    return configure_logging(name, verbose), stop


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


def make_socket(context, kind, bind=None, connect=None, identity=None, hwm=INTERNAL_HWM, curve=None, options=None,
                curve_client=None):
    """A socket whose queues are bounded by `hwm` messages per peer (unless `options` set one
    direction's), bound to one endpoint or a list, or connected. `curve` is the server's (public,
    secret) key pair when peers must use CURVE; `curve_client` is (server public, own public, own
    secret) to connect to such a peer; `options` are more socket options."""
    sock = context.socket(kind)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    for option, value in (options or {}).items():
        sock.setsockopt(option, value)
    if identity:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    if curve:
        sock.curve_publickey, sock.curve_secretkey = curve
        sock.curve_server = True
    apply_curve(sock, curve_client)
    for endpoint in [bind] if isinstance(bind, str) else bind or []:
        sock.bind(endpoint)
    if connect:
        sock.connect(connect)
    return sock
