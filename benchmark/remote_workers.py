"""Does a remote worker raise throughput? One server with one worker, then the same server joined
by `encoder-server worker`, measured in turns.

    python -m benchmark.remote_workers                  # bundled all-MiniLM-L6-v2
    python -m benchmark.remote_workers --model DIR --texts 2000 --batch 256 --rounds 3
    python -m benchmark.remote_workers --netns          # the worker in a network namespace (root)

The server runs `--num-worker 1 --lanes 1 --threads-per-worker 1 --worker-port P`. Each round measures one
client sending `--texts` medium texts (benchmark/corpus.py) in requests of `--batch`, pipelined
(`encode_async`, `--in-flight` requests outstanding): first on the server alone, then after a remote
worker (`--num-worker 1 --lanes 1 --threads-per-worker 1`) has joined and the status shows two workers;
the remote worker is stopped again before the next round. Prints a markdown table of the rounds,
the medians and their ratio (2.0 would be perfect scaling from one core to two), then a control
with no service at all: one single-threaded encoder in-process, then two at once, which is what
this machine's cores give two workers at best (`--no-ceiling` skips it; it needs the benchmark
extra's psutil). Logs stay in a bench-remote-* temp folder when a run fails.
"""
import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from encoder_client import EncoderClient
from encoder_server.ports import free_port

from . import corpus

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 300


class Namespace:
    """A network namespace joined by a veth pair: the server at `host` (.1), the worker at .2."""

    def __init__(self):
        pid = os.getpid()
        self.name, self.veth, self.peer_veth = f"encsrv-bench-{pid}", f"esb{pid}r"[:15], f"esb{pid}n"[:15]
        taken = _ip("-o", "-4", "addr", "show").stdout
        net = random.choice([n for n in range(256) if f"10.234.{n}." not in taken])
        self.host, self.peer = f"10.234.{net}.1", f"10.234.{net}.2"

    def __enter__(self):
        try:
            _ip("netns", "add", self.name)
            _ip("link", "add", self.veth, "type", "veth", "peer", "name", self.peer_veth, "netns", self.name)
            _ip("addr", "add", f"{self.host}/30", "dev", self.veth)
            _ip("link", "set", self.veth, "up")
            _ip("-n", self.name, "addr", "add", f"{self.peer}/30", "dev", self.peer_veth)
            _ip("-n", self.name, "link", "set", self.peer_veth, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_):
        _ip("link", "del", self.veth, check=False)
        _ip("netns", "del", self.name, check=False)


def _ip(*args, check=True):
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


class Group:
    """A command run as its own process group, logged to a file; stopped with SIGTERM, then SIGKILL."""

    def __init__(self, command, log_path, env):
        self.log_path = log_path
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                            start_new_session=True)

    def check(self, what):
        if self.process.poll() is not None:
            raise RuntimeError(f"{what} exited with {self.process.returncode}; see {self.log_path}:\n"
                               + Path(self.log_path).read_text(errors="replace")[-3000:])

    def stop(self, timeout=60):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever of the group is left
        except ProcessLookupError:
            pass
        self.process.wait()


def status(host, port, port_out):
    with EncoderClient(host, port, port_out, timeout=10) as client:
        return client.server_status


def wait_workers(host, port, port_out, count, watched, what, timeout=START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        watched.check(what)
        try:
            state = status(host, port, port_out)
            if state["ready"] and state["workers_alive"] == count:
                return state
        except TimeoutError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {count} workers within {timeout}s; see {watched.log_path}")
        time.sleep(0.2)


def throughput(host, port, port_out, texts, batch, in_flight):
    """Sentences per second for one client sending `texts` in requests of `batch`, pipelined."""
    batches = [texts[start:start + batch] for start in range(0, len(texts), batch)]
    with EncoderClient(host, port, port_out, timeout=300) as client:
        client.encode(texts[:batch])  # warm-up: connections, first passes
        started = time.perf_counter()
        rows = sum(len(result) for result in client.encode_async(batches, max_in_flight=in_flight))
        elapsed = time.perf_counter() - started
    assert rows == len(texts), f"{rows} rows for {len(texts)} texts"
    return len(texts) / elapsed


def _compute_only(model, texts, batch, barrier, results):
    """One single-threaded encoder in this process (tokenizer, planner, backend; no service)."""
    from encoder_server.settings import resolve

    from .engines import our_backend

    engine = our_backend(resolve(model=model, num_worker=1, threads_per_worker=1))
    engine.encode(texts[:batch])  # warm-up
    barrier.wait()
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        engine.encode(texts[start:start + batch])
    results.put(time.perf_counter() - started)


def compute_ceiling(model, texts, batch, processes):
    """Sentences per second of `processes` single-threaded encoders running at once, each on all
    of `texts`, with no service around them: what this machine gives two workers at best."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(processes), spawn.Queue()
    children = [spawn.Process(target=_compute_only, args=(model, texts, batch, barrier, results))
                for _ in range(processes)]
    for child in children:
        child.start()
    times = [results.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    return processes * len(texts) / max(times)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmark.remote_workers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--texts", type=int, default=2000, help="texts per measurement")
    parser.add_argument("--kind", choices=sorted(corpus.WORDS), default="medium", help="text length")
    parser.add_argument("--batch", type=int, default=256, help="texts per request")
    parser.add_argument("--in-flight", type=int, default=4, help="requests outstanding at once")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (one worker, then two)")
    parser.add_argument("--netns", action="store_true",
                        help="run the remote worker in a network namespace joined by a veth pair (needs root)")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="skip the control: one, then two single-threaded encoders in-process, no service")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    texts = corpus.texts(args.kind, args.texts)
    model = ["--model", str(args.model)] if args.model else []
    workdir = Path(tempfile.mkdtemp(prefix="bench-remote-"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    namespace = Namespace() if args.netns else None
    single, joined, shares = [], [], []
    try:
        if namespace:
            namespace.__enter__()
        host = namespace.host if namespace else "127.0.0.1"
        port, port_out, worker_port = free_port(host), free_port(host), free_port(host, consecutive=2)
        server = Group([sys.executable, "-m", "encoder_server.cli", "start", *model, "--host", host,
                        "--port", str(port), "--port-out", str(port_out), "--num-worker", "1", "--lanes", "1",
                        "--threads-per-worker", "1", "--worker-port", str(worker_port)],
                       workdir / "server.log", env)
        try:
            wait_workers(host, port, port_out, 1, server, "the server")
            prefix = ["ip", "netns", "exec", namespace.name] if namespace else []
            for round_ in range(1, args.rounds + 1):
                single.append(throughput(host, port, port_out, texts, args.batch, args.in_flight))
                worker = Group([*prefix, sys.executable, "-m", "encoder_server.cli", "worker", "--connect", host,
                                "--port", str(port), "--port-out", str(port_out), *model, "--num-worker", "1",
                                "--lanes", "1", "--threads-per-worker", "1"], workdir / f"worker-{round_}.log", env)
                try:
                    before = wait_workers(host, port, port_out, 2, worker, "the remote worker")
                    joined.append(throughput(host, port, port_out, texts, args.batch, args.in_flight))
                    after = status(host, port, port_out)["worker_texts_encoded"]
                finally:
                    worker.stop()
                wait_workers(host, port, port_out, 1, server, "the server", timeout=30)
                done = {name: count - before["worker_texts_encoded"].get(name, 0) for name, count in after.items()}
                shares.append(sum(n for name, n in done.items() if "/worker-" in name) / sum(done.values()))
                print(f"round {round_}: 1 worker {single[-1]:.1f}/s, 2 workers {joined[-1]:.1f}/s "
                      f"(the remote worker encoded {shares[-1]:.0%} of those texts)", flush=True)
        finally:
            server.stop()
    finally:
        if namespace:
            namespace.__exit__()

    ceiling = []
    if not args.no_ceiling:
        for _ in range(args.rounds):
            ceiling.append((compute_ceiling(args.model, texts, 64, 1), compute_ceiling(args.model, texts, 64, 2)))
            print(f"control: 1 encoder {ceiling[-1][0]:.1f}/s, 2 encoders at once {ceiling[-1][1]:.1f}/s", flush=True)

    ratio = statistics.median(joined) / statistics.median(single)
    print()
    print(f"Remote worker throughput: {args.texts} {args.kind} texts in requests of {args.batch}, "
          f"{args.in_flight} in flight; {os.cpu_count()} cores; worker {'in a netns' if namespace else 'on 127.0.0.1'}")
    print()
    print("| round | server alone (1 worker) sent./s | + remote worker (2 workers) sent./s | ratio |")
    print("|---|---:|---:|---:|")
    for round_, (alone, both) in enumerate(zip(single, joined), 1):
        print(f"| {round_} | {alone:.1f} | {both:.1f} | {both / alone:.2f} |")
    print(f"| **median** | **{statistics.median(single):.1f}** | **{statistics.median(joined):.1f}** | "
          f"**{ratio:.2f}** |")
    print()
    print(f"The remote worker encoded {statistics.median(shares):.0%} (median) of the texts once it had joined.")
    ceiling_ratio = None
    if ceiling:
        one, two = statistics.median(c[0] for c in ceiling), statistics.median(c[1] for c in ceiling)
        ceiling_ratio = two / one
        print()
        print("Control, no service: the same texts through one single-threaded encoder (tokenizer, batch planner, "
              "backend) in-process, then two such processes at once, each on all the texts.")
        print()
        print("| encoders | sent./s (median) | ratio |")
        print("|---|---:|---:|")
        print(f"| 1 | {one:.1f} | 1.00 |")
        print(f"| 2 at once | {two:.1f} | {ceiling_ratio:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"alone": single, "joined": joined, "ratio": ratio,
                                               "remote_share": shares, "ceiling": ceiling,
                                               "ceiling_ratio": ceiling_ratio,
                                               "texts": args.texts, "kind": args.kind, "batch": args.batch,
                                               "in_flight": args.in_flight, "netns": bool(namespace)}, indent=2))
    for log in workdir.iterdir():
        log.unlink()
    workdir.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
