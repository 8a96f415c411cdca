"""What one hop between two processes costs on this host, which is what a request through the
server pays at each of its hops (client to ventilator, ventilator to worker and to sink, worker to
sink, sink to ventilator and to client) before any of its own work:

    python -m benchmark.hops [--messages 2000]

A ZeroMQ socket hands each message to the I/O thread of its process, which writes it to the
connection; a receiving process's I/O thread reads it and hands it to the thread that polls. A
thread that sleeps must be woken for that, and on a virtual machine a wake-up can cost far more
than the message. Four figures, each a median over `messages`, over ipc as the server's own
processes talk:

- `send_after_idle_us`: the sending thread's time in `send` when its I/O thread has gone to sleep
  (a message every millisecond), which wakes it;
- `send_back_to_back_us`: the same, messages back to back, its I/O thread awake;
- `round_trip_us`: a message to another process and its answer back, both sides sleeping between,
  as one request's hops are when the server is idle;
- `unix_round_trip_us`: the same over a bare Unix socket, which wakes one thread on each side where
  ZeroMQ wakes three (the sender's I/O thread, the receiver's, and the receiving thread).
"""
import argparse
import json
import multiprocessing
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path


def measure(messages=2000):
    """{send_after_idle_us, send_back_to_back_us, round_trip_us, unix_round_trip_us}, medians of
    `messages` each."""
    import zmq
    with tempfile.TemporaryDirectory() as folder:
        zmq_address, unix_path = f"ipc://{Path(folder) / 'zmq'}", str(Path(folder) / "unix")
        context = zmq.Context()
        # never a wait without end: a peer that died makes a send or receive raise zmq.Again
        context.setsockopt(zmq.SNDTIMEO, 30_000)
        context.setsockopt(zmq.RCVTIMEO, 30_000)
        context.setsockopt(zmq.LINGER, 1000)
        try:
            with _Peer(_zmq_peer, zmq_address, 2 * messages + 1, False), context.socket(zmq.PUSH) as push:
                push.connect(zmq_address)
                push.send(b"connected")
                time.sleep(0.3)
                idle = _timed(lambda: push.send(b"x"), messages, pause=0.001)
                back_to_back = _timed(lambda: push.send(b"x"), messages)
            with _Peer(_zmq_peer, zmq_address, messages + 1, True), context.socket(zmq.PAIR) as pair:
                pair.connect(zmq_address)
                pair.send(b"connected")
                pair.recv()
                round_trip = _timed(_ping(pair.send, pair.recv), messages, pause=0.001)
        finally:
            context.term()
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(unix_path)
            listener.listen(1)
            listener.settimeout(30)
            with _Peer(_unix_echo, unix_path, messages):
                connection = listener.accept()[0]
                with connection:
                    connection.settimeout(30)
                    unix_round_trip = _timed(_ping(connection.send, lambda: connection.recv(1)), messages,
                                             pause=0.001)
    return {"send_after_idle_us": idle, "send_back_to_back_us": back_to_back, "round_trip_us": round_trip,
            "unix_round_trip_us": unix_round_trip}


def _ping(send, receive):
    """A round trip: send one byte, wait for the answer."""
    def round_trip():
        send(b"x")
        receive()
    return round_trip


def _timed(step, times, pause=0.0):
    """The median µs of `times` calls of `step`, with `pause` seconds before each."""
    spent = []
    for _ in range(times):
        if pause:
            time.sleep(pause)
        started = time.perf_counter()
        step()
        spent.append(time.perf_counter() - started)
    return round(statistics.median(spent) * 1e6, 1)


class _Peer:
    """The other process, `serve(*args)`, for the length of a `with`."""

    def __init__(self, serve, *args):
        self.process = multiprocessing.get_context("spawn").Process(target=serve, args=args, daemon=True)

    def __enter__(self):
        self.process.start()
        return self

    def __exit__(self, *exc):
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


def _zmq_peer(address, messages, echo):
    """Take `messages` on a PULL, or with `echo` answer each on a PAIR."""
    import zmq
    context = zmq.Context()
    sock = context.socket(zmq.PAIR if echo else zmq.PULL)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)  # never a wait without end: a measurer that died ends this one too
    sock.bind(address)
    try:
        for _ in range(messages):
            message = sock.recv()
            if echo:
                sock.send(message)
    except zmq.Again:
        pass
    finally:
        sock.close(linger=0)
        context.term()


def _unix_echo(path, messages):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        for _ in range(messages):
            sock.send(sock.recv(1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    print(json.dumps(measure(args.messages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
