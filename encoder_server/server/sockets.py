"""The server's sockets: bounded queues, CURVE, the addresses its processes bind and connect, and
what a received frame says about its sender."""
import ipaddress
from dataclasses import dataclass
from functools import partial

import zmq

from encoder_client.keys import apply_curve
from encoder_client.sockets import NOBLOCK, readable, send_frames  # noqa: F401 (the server's loops use them)

POLL_MS = 100
BURST = 64  # messages a loop takes from one socket per turn: a busy loop polls once per burst, not per message
# messages queued per socket peer; the dispatcher keeps far fewer jobs per worker than this
INTERNAL_HWM = 10000
LINGER_MS = 1000  # the longest a stopping process waits for the messages it queued to go out


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

    def ipc_too_long(self):
        """The first ipc endpoint whose path a Unix socket cannot hold (None when all fit)."""
        limit = getattr(zmq, "IPC_PATH_MAX_LEN", 107) or 107
        return next((endpoint for endpoint in (self.backend, self.sink, self.control, self.feedback)
                     if len(endpoint[len("ipc://"):].encode()) > limit), None)


def waiting(sock, copy=True, limit=BURST):
    """The messages waiting on `sock`, which poll said is readable, at most `limit`, without
    blocking: the first is taken at once, each further one once ZeroMQ says it is there (asking
    costs a µs or two, and a receive that finds nothing raises, which costs more). With `copy`,
    each frame as bytes; else as a zmq.Frame."""
    receive = sock.recv_multipart if copy else partial(_frames, sock)
    try:
        first = receive(NOBLOCK)
    except zmq.Again:  # poll said otherwise: never expected, but never a wait
        return
    yield first
    for _ in range(limit - 1):
        if not readable(sock):
            return
        yield receive()


def _frames(sock, flags=0):
    """`sock.recv_multipart(flags, copy=False)`, each next frame known from the last one's `more`
    where pyzmq asks the socket (a µs a frame, on the path of every message)."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:  # the rest of a message arrives with its first: no wait
        frame = sock.recv(copy=False)
        frames.append(frame)
    return frames


def peer_address(frame):
    """The IP address a received frame's sender connected from over tcp; None over ipc (where
    ZeroMQ gives "localhost:UID:GID:PID" from the socket's credentials), or when unknown. (A few µs:
    for the messages that need it, not for every request.)"""
    try:
        address = frame.get("Peer-Address")
        ipaddress.ip_address(address)
    except (zmq.ZMQError, ValueError):
        return None
    return address


def user_id(frame, curve=True):
    """The CURVE client key (its ZAP user id) a received frame came with; None without CURVE (the
    caller may say there is none: asking costs an exception)."""
    if not curve:
        return None
    try:
        return frame.get("User-Id") or None
    except zmq.ZMQError:
        return None


def remote_worker_endpoints(host, worker_port, curve=None):
    return WorkerEndpoints(f"tcp://{host}:{worker_port}", f"tcp://{host}:{worker_port + 1}", curve)


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


def let_queued_messages_out():
    """End this process's ZeroMQ context, which waits up to LINGER_MS for the messages its sockets
    still queue: a stopping sink's last replies, a stopping worker's last parts. Without it they
    are lost, since pyzmq does not end its context at exit and a socket's linger never applies.
    No other thread may be using a socket: those still open are closed here."""
    zmq.Context.instance().destroy(linger=LINGER_MS)
