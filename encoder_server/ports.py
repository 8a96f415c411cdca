"""Free ports for a server started on the fly (`encoder-server check`, the tests, the benchmarks)."""
import os
import random
import socket
from pathlib import Path

LOWEST_PORT = 10_000
SLICE_VARIABLE = "ENCODER_SERVER_PORT_SLICE"  # "INDEX/COUNT", which use_slice sets for the processes started after it


def _ephemeral_range_start():
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# [first, end) of the ports this process hands out, and the next one it tries
_range = [LOWEST_PORT, _ephemeral_range_start()]
_cursor = [random.randrange(_range[0], max(_range[0] + 1, _range[1] - 2000))]


def use_slice(index, count):
    """Hand out only the `index`-th of `count` equal slices of the range, so that processes that
    start servers side by side (parallel test runners) never pick the same port; the processes this
    one starts afterwards (a benchmark run by a test) keep to the same slice."""
    first, end = LOWEST_PORT, _ephemeral_range_start()
    width = (end - first) // count
    _range[:] = [first + index * width, first + (index + 1) * width]
    _cursor[0] = random.randrange(_range[0], _range[1])
    os.environ[SLICE_VARIABLE] = f"{index}/{count}"


def _inherited_slice(value):
    """(index, count) from SLICE_VARIABLE's value; ValueError naming the variable for anything else."""
    index, _, count = value.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise ValueError(f"{SLICE_VARIABLE} must be INDEX/COUNT with 0 <= INDEX < COUNT, got {value[:40]!r}")
    return int(index), int(count)


if os.environ.get(SLICE_VARIABLE):  # started by a process that keeps to a slice
    use_slice(*_inherited_slice(os.environ[SLICE_VARIABLE]))


def free_port(host="127.0.0.1", consecutive=1):
    """The first of `consecutive` free ports on `host`. They lie below the kernel's ephemeral range,
    so no outgoing connection (a client's, a worker's) can take one between this pick and the
    server's bind, and none is handed out twice by one process."""
    first_port, end = _range
    for _ in range(end - first_port):
        first = _cursor[0]
        _cursor[0] = first + consecutive if first + consecutive < end else first_port
        if first + consecutive <= end and all(_bindable(host, port) for port in range(first, first + consecutive)):
            return first
    raise RuntimeError(f"no free port in {first_port}..{end - 1}")


def _bindable(host, port):
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
            return True
        except OSError:
            return False
