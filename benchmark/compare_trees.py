"""Two checkouts of this project, one against the other, in alternating rounds of the same run: the
check that a change which should not alter speed does not.

    git worktree add /tmp/before HEAD~1
    python -m benchmark.compare_trees /tmp/before . --rounds 3

Each round starts each tree's server on the bundled model with default flags and measures the
p50 latency of one-text requests (short texts) and the sentences/s of 256-text requests (medium
texts), through the same EncoderClient. It prints medians over rounds and the ratios.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from encoder_client import EncoderClient

from . import corpus
from .engines import START_TIMEOUT, free_port


def serve(tree, port, port_out):
    process = subprocess.Popen([sys.executable, "-m", "encoder_server.cli", "start", "--port", str(port),
                                "--port-out", str(port_out)], cwd=tree, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with EncoderClient("127.0.0.1", port, port_out, timeout=1) as client:
                if client.server_status["ready"]:
                    return process
        except TimeoutError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server of {tree} did not become ready")


def measure(port, port_out, singles, batch, repeats):
    with EncoderClient("127.0.0.1", port, port_out, timeout=120) as client:
        client.encode(batch[:32])  # warm-up
        latencies = []
        for text in singles:
            started = time.perf_counter()
            client.encode([text])
            latencies.append(time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(repeats):
            client.encode(batch)
        return statistics.median(latencies) * 1000, repeats * len(batch) / (time.perf_counter() - started)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--singles", type=int, default=200, help="one-text requests per round")
    parser.add_argument("--repeats", type=int, default=5, help="256-text requests per round")
    args = parser.parse_args(argv)
    singles, batch = corpus.texts("short", args.singles), corpus.texts("medium", 256)
    results = {"before": [], "after": []}
    for round_ in range(args.rounds):
        for name in results:
            ports = free_port(), free_port()
            server = serve(getattr(args, name).resolve(), *ports)
            try:
                results[name].append(measure(*ports, singles, batch, args.repeats))
            finally:
                server.terminate()
                server.wait(60)
            p50, rate = results[name][-1]
            print(f"round {round_ + 1} {name:6}: batch-1 p50 {p50:.2f} ms, 256 texts {rate:.0f} sentences/s", flush=True)
    (p50_before, rate_before), (p50_after, rate_after) = (
        [statistics.median(row[i] for row in results[name]) for i in (0, 1)] for name in results)
    print(f"medians: before {p50_before:.2f} ms, {rate_before:.0f}/s; after {p50_after:.2f} ms, {rate_after:.0f}/s")
    print(f"after / before: batch-1 p50 {p50_after / p50_before:.3f}, throughput {rate_after / rate_before:.3f}")


if __name__ == "__main__":
    main()
