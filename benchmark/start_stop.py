"""What a server's start and stop cost: seconds from `encoder-server start` to its first reply, seconds
from SIGTERM to its exit, and the CPU seconds its whole process tree spent over both.

    python -m benchmark.start_stop [--model DIR] [--repeats 5] [-- server flags]

Each figure is the median of `--repeats` starts. The CPU is what the reaped server and its children
used (RUSAGE_CHILDREN), so nothing else that this process starts may run meanwhile.
"""
import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmark import engines  # noqa: E402
from encoder_client import EncoderClient  # noqa: E402


def start_and_stop(model, flags, log):
    """(seconds to the first reply, seconds to stop, CPU seconds) of one server."""
    port, port_out = engines.free_port(), engines.free_port()
    cpu_before = _children_cpu()
    started = time.monotonic()
    server = subprocess.Popen(engines.start_command(port, port_out, model, flags), stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        with EncoderClient("127.0.0.1", port, port_out, timeout=120) as client:
            client.encode(["the first request"])
        ready = time.monotonic() - started
        stopping = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(60)
        return ready, time.monotonic() - stopping, _children_cpu() - cpu_before
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a model folder (default: the bundled model)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--log", default=os.devnull, help="where the servers' logs go")
    parser.add_argument("flags", nargs="*", help="flags for encoder-server start, after --")
    args = parser.parse_args(argv)
    with open(args.log, "w") as log:
        runs = [start_and_stop(args.model, args.flags, log) for _ in range(args.repeats)]
    print(json.dumps({name: round(statistics.median(run[i] for run in runs), 2)
                      for i, name in enumerate(("ready_s", "stop_s", "cpu_s"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
