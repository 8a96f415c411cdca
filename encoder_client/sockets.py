"""The sockets both clients connect to a server with, and how they notice a broken connection."""
import zmq

from .keys import apply_curve

AUTH_FAILED = zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
# ZeroMQ's own heartbeats: a server that vanished without closing the connection (a host gone, a
# network cut) counts as disconnected after HEARTBEAT_TIMEOUT_MS, so no wait for it is endless
HEARTBEAT_IVL_MS, HEARTBEAT_TIMEOUT_MS = 2000, 8000
# a reply sent just before a server stops can arrive after the break is seen (the request and
# result ports are two connections): requests in flight count as lost only this long after it
LOST_GRACE_S = 1.0


def readable(sock):
    """Whether a message waits on `sock`, asked without a poll (and in plain ints: pyzmq's enums cost
    microseconds per operation, on a path taken for every message)."""
    return sock.getsockopt(_EVENTS) & _POLLIN


def send_frames(sock, frames, flags=0, copy=True):
    """`sock.send_multipart(frames, flags, copy=copy)` in plain ints, for the paths taken by every
    request: pyzmq's own adds its enum SNDMORE to the flags, about 2 µs a message. `flags` is an int
    such as NOBLOCK. As ZeroMQ's multipart messages are atomic, zmq.Again can only come from the
    first frame, and then nothing was sent."""
    more = _SNDMORE | flags
    for frame in frames[:-1]:
        sock.send(frame, more, copy=copy)
    sock.send(frames[-1], flags, copy=copy)


_EVENTS, _POLLIN, _SNDMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)


def client_socket(context, kind, address, curve, options=None):
    sock = context.socket(kind)
    for option, value in {zmq.LINGER: 0, zmq.HEARTBEAT_IVL: HEARTBEAT_IVL_MS,
                          zmq.HEARTBEAT_TIMEOUT: HEARTBEAT_TIMEOUT_MS, **(options or {})}.items():
        sock.setsockopt(option, value)
    apply_curve(sock, curve)
    sock.connect(address)
    return sock


def break_monitors(sender, receiver):
    """Monitor sockets that report a broken connection on either socket (a server process that
    died, even one the server restarts), and on the receiver a refused CURVE key too."""
    return [receiver.get_monitor_socket(zmq.EVENT_DISCONNECTED | AUTH_FAILED),
            sender.get_monitor_socket(zmq.EVENT_DISCONNECTED)]


def monitor_event(monitor):
    """The event of the message waiting on a monitor socket (zmq.EVENT_*)."""
    from zmq.utils.monitor import recv_monitor_message  # here, not at import: it imports asyncio (0.2 CPU s,
    # which each server process would pay, as each imports this package), and events are rare
    return recv_monitor_message(monitor)["event"]
