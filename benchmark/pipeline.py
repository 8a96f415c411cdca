"""The server's own ceiling: requests through ventilator -> workers -> sink on the zero backend
(encoder_server/model/zero_backend.py), which runs no model, so that what limits the rate is the
server's own work per request and per text (and the clients', which run beside it on the same
cores, as they do in every scenario here). The server schedules it as it does a GPU, the device
whose ceiling this is (model/passes.py's on_a_fast_device): passes cut by the token budget and the
row limit alone, and three bulk jobs held per lane.

    python -m benchmark.pipeline [--seconds 5] [--repeats 3] [--loaders 2] [-- server flags]

It first prints what one hop between two processes costs on this host (benchmark/hops.py).

Clients run in `--loaders` processes (threads of the sync client in each), so that one client
process's interpreter does not cap the rate it measures. Each cell is a closed loop: every client
sends its request, waits for the reply and sends again; replies that arrive inside the window count.

Beside the rates, each cell says how much CPU time each stage spent per request over the window
(the ventilator, the sink, the workers together, the clients together): on a host with cores to
spare, one ventilator and one sink serve at most 1e6 / (their µs per request) requests a second,
whatever the workers do, which is the ceiling that more workers cannot lift.
"""
import argparse
import json
import multiprocessing
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmark import corpus, engines, hops, load  # noqa: E402

CELLS = (("32 clients x 32 short texts", 32, 32), ("32 clients x 1 short text", 32, 1))
ZERO_BACKEND = {"ENCODER_SERVER_ZERO_BACKEND": "1"}


def measure(model=None, flags=(), cells=CELLS, seconds=5.0, repeats=3, loaders=2, log_dir=None):
    """[{cell, clients, batch, texts_per_s, requests_per_s, p50_ms, p99_ms, cpu_us_per_request}] on the
    zero backend, the median of `repeats` windows of `seconds` each."""
    with engines.Service("service (zero backend)", ("--backend", "zero", *flags), model, log_dir,
                         env=ZERO_BACKEND) as server:
        return measure_cells(server, cells, seconds, repeats, loaders)


def measure_cells(server, cells=CELLS, seconds=5.0, repeats=3, loaders=2):
    """measure's rows for a server already started (an engines.Server: its ports and process)."""
    rows = []
    for name, clients, batch in cells:
        runs = [closed_loop(server.port, server.port_out, clients, batch, seconds, loaders, server.process.pid)
                for _ in range(repeats)]
        stages = [run.pop("cpu_us_per_request") for run in runs]
        rows.append({"cell": name, "clients": clients, "batch": batch, **load.median_of(runs),
                     "cpu_us_per_request": load.median_of(stages)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def closed_loop(port, port_out, clients, batch, seconds, loaders, server_pid=None, warmup=1.0, during=None):
    """{texts_per_s, requests_per_s, p50_ms, p99_ms, cpu_us_per_request: {stage: µs}} of `clients`
    closed-loop clients spread over `loaders` processes (the stages' CPU needs the server's pid).
    The window opens `warmup` seconds after the last client has connected and sent its first request;
    `during`, if given, is called on a thread of its own with the window (wall-clock start and end)."""
    loaders = max(1, min(loaders, clients))
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(loaders) as pool:
        start = Start(manager, clients)
        shares = [clients * i // loaders for i in range(loaders + 1)]
        pending = pool.starmap_async(_load, [(port, port_out, high - low, low, batch, start)
                                             for low, high in zip(shares, shares[1:])])
        window = start.open(warmup, seconds)
        cpu = CpuClock(lambda: stage_cpu_seconds(server_pid), window) if window else None
        watcher = threading.Thread(target=during, args=(window,), daemon=True) if during and window else None
        if watcher:
            watcher.start()
        # raises the loaders' error if a client failed before the window opened
        results = pending.get(timeout=STARTUP_S + warmup + seconds + 60)
        if watcher:
            watcher.join(seconds + 60)
    latencies = sorted(latency for result in results for latency in result)
    requests = len(latencies)
    return {"texts_per_s": requests * batch / seconds, "requests_per_s": requests / seconds,
            "p50_ms": 1000 * latencies[requests // 2] if latencies else float("nan"),
            "p99_ms": 1000 * latencies[min(requests - 1, requests * 99 // 100)] if latencies else float("nan"),
            "cpu_us_per_request": {stage: 1e6 * spent / max(1, requests) for stage, spent in cpu.spent().items()}}


STARTUP_S = 60.0  # the longest wait for every loader and client to be connected and warm


class Start:
    """The moment every client is ready, shared by the loaders and this process: each client waits at
    `ready` once connected and warm; this process then fixes the window and lets them go."""

    def __init__(self, manager, clients):
        self.ready = manager.Barrier(clients + 1, timeout=STARTUP_S)
        self.go = manager.Event()
        self.shared = manager.dict()

    def open(self, warmup, seconds):
        """(start, end) of the window once every client is ready; None if one failed before (the
        loaders then report why)."""
        try:
            self.ready.wait()
        except threading.BrokenBarrierError:
            return None
        begin = time.time() + warmup
        window = self.shared["window"] = (begin, begin + seconds)
        self.go.set()
        return window

    def wait(self):
        """The window, once every client is ready (a client calls this when it is)."""
        self.ready.wait()
        if not self.go.wait(STARTUP_S):
            raise TimeoutError("the benchmark's window never opened")
        return self.shared["window"]

    def abandon(self):
        """Lets the others stop waiting: this client will never be ready."""
        self.ready.abort()


class CpuClock:
    """CPU seconds spent over `window` (wall-clock start and end), by whatever `read` tells apart:
    read() gives {key: CPU seconds so far}, taken on a thread of its own at the window's two ends."""

    def __init__(self, read, window):
        self.read, self.window = read, window
        self.readings = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def spent(self):
        self.thread.join()
        if len(self.readings) < 2:
            return {}
        first, last = self.readings
        return {key: last.get(key, 0.0) - first.get(key, 0.0) for key in last}

    def _read(self):
        for moment in self.window:
            time.sleep(max(0.0, moment - time.time()))
            self.readings.append(self.read())


def stage_cpu_seconds(server_pid, clients=True):
    """CPU seconds each stage has spent so far: the server's processes (`server_pid` and its
    children), told apart by the names they give themselves, and with `clients` this process's
    other children (the loaders)."""
    import psutil
    totals = {}
    server = {process.pid: process for process in process_tree(server_pid)} if server_pid else {}
    others = [process for process in psutil.Process().children(recursive=True) if process.pid not in server
              and process.pid != server_pid] if clients else []
    for stage, processes in (*((stage_of(process), [process]) for process in server.values()), ("clients", others)):
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            totals[stage] = totals.get(stage, 0.0) + times.user + times.system
    return totals


def process_tree(pid):
    """The process `pid` and all its descendants (none once it is gone)."""
    import psutil
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def stage_of(process):
    """The server's stage a process of its tree is, by the name it gives itself."""
    name = process.name()
    return "workers" if "worker-" in name else name if name in ("ventilator", "sink") else "other"


def _load(port, port_out, clients, first, batch, start):
    """One loader process: `clients` threads, each a sync client; the latencies of the requests
    that finished inside the window that `start` opens once every client is ready."""
    from encoder_client import EncoderClient
    texts = corpus.texts("short", 4096)
    latencies, errors = [], []

    def user(index):
        try:
            with EncoderClient("127.0.0.1", port, port_out, timeout=60) as client:
                offset = index * batch
                client.encode(texts[:batch])  # connected and warm
                window = start.wait()
                while time.time() < window[1]:
                    sent = time.perf_counter()
                    client.encode([texts[(offset + i) % len(texts)] for i in range(batch)])
                    finished = time.time()
                    offset += 997 * batch
                    if window[0] <= finished <= window[1]:
                        latencies.append(time.perf_counter() - sent)
        except Exception as error:  # reported by the caller
            start.abandon()
            errors.append(error)

    threads = [threading.Thread(target=user, args=(first + i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}")
    return latencies


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loaders", type=int, default=2, help="client processes")
    parser.add_argument("--out", default=None, help="write the rows as JSON to this file")
    parser.add_argument("flags", nargs="*", help="server flags, after --")
    args = parser.parse_args(argv)
    print(json.dumps({"hops": hops.measure(1000)}), flush=True)  # what each of a request's hops costs here
    rows = measure(args.model, args.flags, seconds=args.seconds, repeats=args.repeats, loaders=args.loaders)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
