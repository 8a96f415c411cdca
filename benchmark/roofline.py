"""The least a request through the server's chain of processes costs on this host: a bare chain of
the server's shape that answers the real clients with zero rows and does nothing else, measured in
benchmark/pipeline.py's cells beside the server on the zero backend, in alternated rounds.

    python -m benchmark.roofline [--seconds 5] [--repeats 1] [--rounds 2] [--out FILE]

The chain has the processes, sockets and threads of the server: a ventilator (PULL from the
clients over tcp, ROUTER to the workers, PUSH to the sink, PULL of its word back), two workers
(DEALER; an intake thread that hands each message to a lane thread, which sends it on a PUSH of
its own), and a sink (PULL from the workers and from the ventilator, XPUB to the clients). In each
turn the ventilator takes every waiting request, reads its texts (the least it must do to know its
rows), registers the turn's requests with the sink in one message and deals them to the next
worker in another; the sink publishes each request's zero rows and tells the ventilator which
requests are done, one message a turn. So a request pays the hops, the ZeroMQ I/O threads, the
wake-ups and the process switches that the server's design costs, and none of the server's own
work: checking, scheduling, tokenizing, assembling, bookkeeping.

What the server serves against the chain, on the same cores and with the same clients, is how much
of the design's ceiling its own work leaves; their CPU per request, stage by stage, is what that
work costs when served (several times what the same code costs run warm in one process here,
where every hop wakes another process on a CPU whose caches hold someone else's).
"""
import argparse
import ctypes
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections import deque
from pathlib import Path

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmark import engines, load, pipeline  # noqa: E402
from encoder_client import EncoderClient  # noqa: E402
from encoder_client.json_frames import from_json, to_json  # noqa: E402
from encoder_client.protocol import decode_request, decode_texts, encode_data, encode_result  # noqa: E402
from encoder_server.server.sockets import BURST  # noqa: E402

WORKERS = 2
WIDTH = 384  # the bundled model's embedding size, as the zero backend serves it
CONFIG = {"ready": True}  # what a client's handshake (SHOW_CONFIG) and a status probe are told


class Chain(engines.Server):
    """The bare chain as a benchmark server: started in a process group of its own."""
    name = "bare chain"

    def __init__(self, log_dir=None):
        self.port, self.port_out = engines.free_port(), engines.free_port()
        self.command = [sys.executable, "-m", "benchmark.roofline", "--serve", str(self.port), str(self.port_out)]
        self.env = dict(os.environ)
        self._place_log(log_dir, f"bench-chain-{self.port}")  # (benchmark/run.py removes bench-*.log)

    def ready(self):
        try:
            EncoderClient("127.0.0.1", self.port, self.port_out, timeout=1).close()
            return True
        except TimeoutError as error:
            self.last_probe = str(error)
            return False


def serve(port, port_out):
    """Run the chain until SIGTERM (the benchmark stops its process group)."""
    run_dir = tempfile.mkdtemp(prefix="chain-")
    stages = [multiprocessing.Process(target=_sink, args=(port_out, run_dir), daemon=True),
              multiprocessing.Process(target=_ventilator, args=(port, run_dir), daemon=True),
              *(multiprocessing.Process(target=_worker, args=(index, run_dir), daemon=True)
                for index in range(WORKERS))]
    try:
        for stage in stages:
            stage.start()
        # the stages die of SIGTERM as it comes; this process first removes their socket files
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        for stage in stages:
            stage.join()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _ventilator(port, run_dir):
    _name("ventilator")
    context = zmq.Context()
    frontend = _bound(context, zmq.PULL, f"tcp://127.0.0.1:{port}")
    backend = _bound(context, zmq.ROUTER, f"ipc://{run_dir}/backend")
    feedback = _bound(context, zmq.PULL, f"ipc://{run_dir}/feedback")
    control = _connected(context, zmq.PUSH, f"ipc://{run_dir}/control")
    poller = _poller(frontend, backend, feedback)
    workers, turn = [], 0
    while True:
        events = dict(poller.poll(1000))
        if backend in events:  # a worker's READY
            workers += [frames[0] for frames in _waiting(backend)]
        if feedback in events:
            list(_waiting(feedback))  # the requests done: nothing here waits on them
        if frontend in events and workers:
            requests = [_request(frames) for frames in _waiting(frontend)]
            control.send(to_json(requests))
            backend.send_multipart([workers[turn % len(workers)], to_json(requests)])
            turn += 1


def _request(frames):
    """[identity, req_id, rows] of a client's request (rows -1: a command)."""
    request = decode_request(frames)
    rows = -1 if request.command else len(decode_texts(request))
    return [request.identity.decode("latin-1"), request.req_id, rows]  # (any bytes, as a JSON string)


def _worker(index, run_dir):
    _name(f"worker-{index}")
    context = zmq.Context()
    jobs = _connected(context, zmq.DEALER, f"ipc://{run_dir}/backend")
    jobs.send(b"READY")
    buffered, wake = deque(), threading.Condition()

    def lane():
        results = _connected(context, zmq.PUSH, f"ipc://{run_dir}/sink")
        while True:
            with wake:
                wake.wait_for(lambda: buffered)
                passes = list(buffered)
                buffered.clear()
            for message in passes:
                results.send(message)

    threading.Thread(target=lane, daemon=True).start()
    while True:
        for frames in _waiting(jobs, block=True):
            with wake:
                buffered.append(frames[0])
                wake.notify()


def _sink(port_out, run_dir):
    _name("sink")
    context = zmq.Context()
    parts = _bound(context, zmq.PULL, f"ipc://{run_dir}/sink")
    control = _bound(context, zmq.PULL, f"ipc://{run_dir}/control")
    publish = _bound(context, zmq.XPUB, f"tcp://127.0.0.1:{port_out}")
    feedback = _connected(context, zmq.PUSH, f"ipc://{run_dir}/feedback")
    poller = _poller(parts, control, publish)
    while True:
        events = dict(poller.poll(1000))
        if publish in events:
            list(_waiting(publish))  # subscriptions, applied by XPUB itself
        if control in events:
            list(_waiting(control))  # registrations: a part carries all its reply needs
        if parts in events:
            done = []
            for frames in _waiting(parts):
                for identity, req_id, rows in from_json(frames[0]):
                    done.append(req_id)
                    publish.send_multipart(_reply(identity.encode("latin-1"), req_id, rows))
            feedback.send(to_json(done))


def _reply(identity, req_id, rows):
    """The frames of a reply as the server publishes them: a command's data, or zero rows."""
    if rows < 0:
        return encode_data(identity, req_id, CONFIG)
    return encode_result(identity, req_id, np.zeros((rows, WIDTH), np.float32), num_tokens=0)


def _bound(context, kind, endpoint):
    sock = context.socket(kind)
    sock.bind(endpoint)
    return sock


def _connected(context, kind, endpoint):
    sock = context.socket(kind)
    sock.connect(endpoint)
    return sock


def _poller(*socks):
    poller = zmq.Poller()
    for sock in socks:
        poller.register(sock, zmq.POLLIN)
    return poller


def _waiting(sock, block=False):
    """The messages waiting on `sock`, at most BURST; with `block`, once one has come."""
    try:
        yield sock.recv_multipart(0 if block else zmq.NOBLOCK)
    except zmq.Again:
        return
    for _ in range(BURST - 1):
        if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return
        yield sock.recv_multipart()


def _name(name):
    """Name this process as the server's are, so that pipeline.stage_of counts its CPU as that stage."""
    ctypes.CDLL(None).prctl(15, name.encode())


ENGINES = ("service", "bare chain")


def measure(seconds=5.0, repeats=1, rounds=2, loaders=2, model=None, log_dir=None):
    """pipeline.py's rows for the service on the zero backend and for the bare chain, each figure
    the median of `rounds` in which the two take turns (which goes first alternates), each row
    naming its `engine`; the service's rows also give, round by round, its rate over the chain's
    (`of_chain`: texts/s in the cell of batches, requests/s in the one of single texts)."""
    measured = {engine: [] for engine in ENGINES}
    for number in range(rounds):
        for engine in ENGINES[::1 if number % 2 == 0 else -1]:
            print(json.dumps({"measuring": engine}), flush=True)
            if engine == "service":
                rows = pipeline.measure(model, seconds=seconds, repeats=repeats, loaders=loaders, log_dir=log_dir)
            else:
                with Chain(log_dir) as chain:
                    rows = pipeline.measure_cells(chain, seconds=seconds, repeats=repeats, loaders=loaders)
            measured[engine].append(rows)
    return summarize(measured)


def summarize(measured):
    """measure's rows from {engine: [pipeline.py's rows, a list per round]}."""
    by_cell = {engine: [{row["cell"]: row for row in rows} for rows in measured[engine]] for engine in ENGINES}
    results = []
    for engine in ENGINES:
        for cell, _, batch in pipeline.CELLS:
            rounds = [rows[cell] for rows in by_cell[engine]]
            figures = load.median_of([{key: value for key, value in row.items()
                                                if key not in ("cell", "cpu_us_per_request")} for row in rounds])
            stages = load.median_of([row["cpu_us_per_request"] for row in rounds])
            results.append({"engine": engine, "cell": cell, **figures, "cpu_us_per_request": stages})
            if engine == "service":
                rate = "texts_per_s" if batch > 1 else "requests_per_s"
                results[-1]["of_chain"] = [round(service[cell][rate] / chain[cell][rate], 2)
                                           for service, chain in zip(by_cell["service"], by_cell["bare chain"])]
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=1, help="windows per cell and round (their median)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loaders", type=int, default=2, help="client processes")
    parser.add_argument("--out", default=None, help="write the rows as JSON to this file")
    parser.add_argument("--serve", nargs=2, type=int, metavar=("PORT", "PORT_OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(*args.serve)
        return 0
    results = measure(args.seconds, args.repeats, args.rounds, args.loaders)
    for row in results:
        if "of_chain" in row:
            print(json.dumps({"cell": row["cell"], "service / bare chain, per round": row["of_chain"]}))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
