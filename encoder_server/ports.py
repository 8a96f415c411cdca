"""Free ports for a server started on the fly (`encoder-server check`, the tests, the benchmarks)."""
import random
import socket
from pathlib import Path

_LOWEST_PORT = 10_000


def _ephemeral_range_start():
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_cursor = [random.randrange(_LOWEST_PORT, max(_LOWEST_PORT + 1, _ephemeral_range_start() - 2000))]


def free_port(host="127.0.0.1", consecutive=1):
    """The first of `consecutive` free ports on `host`. They lie below the kernel's ephemeral range,
    so no outgoing connection (a client's, a worker's) can take one between this pick and the
    server's bind, and none is handed out twice by one process."""
    end = _ephemeral_range_start()
    for _ in range(end):
        first = _cursor[0]
        _cursor[0] = first + consecutive if first + consecutive < end else _LOWEST_PORT
        if first + consecutive <= end and all(_bindable(host, port) for port in range(first, first + consecutive)):
            return first
    raise RuntimeError("no free port below the ephemeral range")


def _bindable(host, port):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
            return True
        except OSError:
            return False
