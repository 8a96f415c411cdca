"""Two checkouts of this project, one against the other, in alternating rounds of the same run: the
check that a change which should not alter speed does not.

    git worktree add /tmp/before HEAD~1
    python -m benchmark.compare_trees /tmp/before . --rounds 4 [-- server flags]

Each round starts each tree's server on the bundled model (or `--model`) with default flags (or
those after --), the trees going first in turn (before, after; after, before; ...), and measures,
through that tree's own EncoderClient (so a change to the wire format compares fairly): the p50 and
p99 latency of one-text requests (short texts), the sentences/s of 256-text requests (medium texts,
or `--kind`), and the replies/s of one-text requests pipelined 64 deep on one client (many small
replies to one identity). It prints medians over rounds and the ratios; an even number of rounds
cancels a steady drift of the host's speed.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from . import corpus
from .engines import START_TIMEOUT, free_port
from .load import turn_orders

# run with the tree as its working directory, so that its own encoder_client is imported
MEASURE = r"""
import json, statistics, sys, time
from encoder_client import EncoderClient
port, port_out, repeats = (int(value) for value in sys.argv[1:4])
singles, batch, pipelined = json.load(sys.stdin)
deadline = time.monotonic() + float(sys.argv[4])
while True:
    try:
        client = EncoderClient("127.0.0.1", port, port_out, timeout=120)
        if client.server_status["ready"]:
            break
        client.close()
    except TimeoutError:
        pass
    if time.monotonic() > deadline:
        sys.exit("the server did not become ready")
    time.sleep(0.2)
client.encode(batch[:32])
latencies = []
for text in singles:
    started = time.perf_counter()
    client.encode([text])
    latencies.append(time.perf_counter() - started)
started = time.perf_counter()
for _ in range(repeats):
    client.encode(batch)
rate = repeats * len(batch) / (time.perf_counter() - started)
started = time.perf_counter()
replies = sum(1 for _ in client.encode_async(([text] for text in pipelined), max_in_flight=64))
replies_rate = replies / (time.perf_counter() - started)
client.close()
print(json.dumps([statistics.median(latencies) * 1000, statistics.quantiles(latencies, n=100)[98] * 1000, rate,
                  replies_rate]))
"""
NAMES = ("batch-1 p50 ms", "batch-1 p99 ms", "256 texts, sentences/s", "pipelined replies/s")


def measure(tree, texts, repeats, model=None, flags=()):
    """Start `tree`'s server and measure it with `tree`'s client; returns one value per NAMES."""
    port, port_out = free_port(), free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    model_flags = ["--model", str(model)] if model else []
    server = subprocess.Popen([sys.executable, "-m", "encoder_server.cli", "start", "--port", str(port),
                               "--port-out", str(port_out), *model_flags, *flags], cwd=tree, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        finished = subprocess.run([sys.executable, "-c", MEASURE, str(port), str(port_out), str(repeats),
                                   str(START_TIMEOUT)], cwd=tree, env=env, input=json.dumps(texts), text=True,
                                  capture_output=True, timeout=START_TIMEOUT + 600)
        if finished.returncode:
            raise SystemExit(f"measuring {tree} failed: {finished.stderr.strip()[-2000:]}")
        return json.loads(finished.stdout)
    finally:
        server.terminate()
        server.wait(60)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=4, help="an even number cancels a steady drift")
    parser.add_argument("--model", type=Path, default=None,
                        help="a model folder (default: the bundled model); a tiny one shows the service's own costs")
    parser.add_argument("--singles", type=int, default=400, help="one-text requests per round")
    parser.add_argument("--repeats", type=int, default=5, help="256-text requests per round")
    parser.add_argument("--kind", choices=sorted(corpus.WORDS), default="medium", help="the 256-text requests' texts")
    parser.add_argument("--pipelined", type=int, default=2000, help="pipelined one-text requests per round")
    parser.add_argument("flags", nargs="*", help="server flags, after --")
    args = parser.parse_intermixed_args(argv)  # intermixed: flags after -- follow the two trees' options
    texts = (corpus.texts("short", args.singles), corpus.texts(args.kind, 256), corpus.texts("short", args.pipelined))
    results = {"before": [], "after": []}
    for round_, turn in enumerate(turn_orders(list(results), args.rounds)):
        for name in turn:
            results[name].append(measure(getattr(args, name).resolve(), texts, args.repeats,
                                         args.model and args.model.resolve(), args.flags))
            shown = ", ".join(f"{label} {value:.2f}" for label, value in zip(NAMES, results[name][-1]))
            print(f"round {round_ + 1} {name:6}: {shown}", flush=True)
    medians = {name: [statistics.median(row[i] for row in rows) for i in range(len(NAMES))]
               for name, rows in results.items()}
    for name, values in medians.items():
        print(f"median {name:6}: " + ", ".join(f"{label} {value:.2f}" for label, value in zip(NAMES, values)))
    print("after / before: " + ", ".join(f"{label} {after / before:.3f}" for label, before, after in
                                         zip(NAMES, medians["before"], medians["after"])))


if __name__ == "__main__":
    main()
