"""Where the CPU goes while the server carries requests on the zero backend (benchmark/pipeline.py's
cells): `perf record -a` over one cell's window, split by process (the clients, the ventilator, the
sink, the workers, and ZeroMQ's I/O threads of them all) and by what ran (the Python interpreter, the
kernel, ZeroMQ, other native code such as numpy, orjson or libc), in percent of all CPU time.

    python -m benchmark.cpu_split [--batch 1] [--clients 32] [--seconds 5] [-- server flags]

It needs Linux `perf` and the right to record every CPU (root, or perf_event_paranoid at most 0).
With `--threads` it needs neither: it reads, from Linux's /proc, the user and system CPU time of
each stage's threads over the window, in µs per request, its own threads (the loop of the
ventilator and of the sink; a worker's intake, tokenizing threads and lanes, which all bear its
name) apart from ZeroMQ's (ZMQbg/...).
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmark import engines, pipeline  # noqa: E402

PROCESSES = ("clients", "ventilator", "sink", "workers", "ZeroMQ I/O threads", "other", "idle")
KINDS = ("Python", "kernel", "ZeroMQ", "other native")
SAMPLES_PER_S = 499
ZEROMQ_THREADS = "ZMQbg/"  # how ZeroMQ names its I/O (and reaper) threads


def split(report):
    """{process: {kind: percent}} from `perf report --sort comm,dso --stdio`: each row's command
    (a process or thread name) and shared object, grouped as PROCESSES and KINDS say."""
    shares = {}
    for line in report.splitlines():
        row = re.match(r"\s*([\d.]+)%\s+(.+?)\s+(\S+)\s*$", line)  # perf's header lines start with #
        if row:
            percent, command, kind = float(row.group(1)), row.group(2), _kind(row.group(3))
            kinds = shares.setdefault(_process(command), dict.fromkeys(KINDS, 0.0))
            kinds[kind] = round(kinds[kind] + percent, 2)
    return shares


def _process(command):
    if command in ("ventilator", "sink"):
        return command
    if command.startswith("worker-"):
        return "workers"
    if command.startswith(ZEROMQ_THREADS):
        return "ZeroMQ I/O threads"
    if command == "swapper":
        return "idle"
    return "clients" if command == "python" else "other"  # the loaders' interpreters (and this one)


def _kind(library):
    if "libpython" in library:
        return "Python"
    if library == "[kernel.kallsyms]":
        return "kernel"
    return "ZeroMQ" if "zmq" in library.lower() else "other native"


def table(shares):
    """Markdown rows: percent of all CPU time by process and kind, busy time's totals last."""
    lines = [f"| process | {' | '.join(KINDS)} | all |", "|---|" + "---:|" * (len(KINDS) + 1)]
    for process in PROCESSES:
        kinds = shares.get(process, dict.fromkeys(KINDS, 0.0))
        lines.append(f"| {process} | " + " | ".join(f"{kinds[kind]:.1f}" for kind in KINDS)
                     + f" | {sum(kinds.values()):.1f} |")
    busy = [kinds for process, kinds in shares.items() if process != "idle"]
    lines.append("| all but idle | " + " | ".join(f"{sum(kinds[kind] for kinds in busy):.1f}" for kind in KINDS)
                 + f" | {sum(sum(kinds.values()) for kinds in busy):.1f} |")
    return lines


def record(window, data):
    """`perf record -a` into `data` over `window` (wall-clock start and end)."""
    time.sleep(max(0.0, window[0] - time.time()))
    seconds = max(0.0, window[1] - time.time())
    subprocess.run(["perf", "record", "-a", "-F", str(SAMPLES_PER_S), "-o", str(data), "--", "sleep", f"{seconds:.2f}"],
                   check=True, capture_output=True, timeout=seconds + 60)


def measure(batch=1, clients=32, seconds=5.0, loaders=2, flags=()):
    """(the cell's closed-loop figures, {process: {kind: percent}}) on the zero backend, the server
    started with `flags` beside its defaults."""
    with tempfile.TemporaryDirectory() as folder, \
            engines.Service("service (zero backend)", ("--backend", "zero", *flags),
                            env=pipeline.ZERO_BACKEND) as server:
        data = Path(folder) / "perf.data"
        cell = pipeline.closed_loop(server.port, server.port_out, clients, batch, seconds, loaders,
                                    server.process.pid, during=lambda window: record(window, data))
        report = subprocess.run(["perf", "report", "-i", str(data), "--sort", "comm,dso", "--stdio"], check=True,
                                capture_output=True, text=True, timeout=300).stdout
    return cell, split(report)


def thread_seconds(server_pid):
    """{(stage, "own" or "ZeroMQ", "user" or "system"): CPU seconds so far} of the server's threads."""
    import psutil
    totals = {}
    for process in pipeline.process_tree(server_pid):
        try:
            threads = process.threads()
            stage = pipeline.stage_of(process)
        except psutil.Error:
            continue
        for thread in threads:
            group = "ZeroMQ" if _thread_name(process.pid, thread.id).startswith(ZEROMQ_THREADS) else "own"
            for kind, seconds in (("user", thread.user_time), ("system", thread.system_time)):
                totals[stage, group, kind] = totals.get((stage, group, kind), 0.0) + seconds
    return totals


def _thread_name(pid, tid):
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def measure_threads(batch=1, clients=32, seconds=5.0, loaders=2, flags=()):
    """(the cell's closed-loop figures, {"stage, threads": {user_us, system_us} per request}) on the
    zero backend, the server started with `flags` beside its defaults."""
    used_by_thread = []

    def read(window):  # on closed_loop's watcher thread, which it waits for
        used_by_thread.append(pipeline.CpuClock(lambda: thread_seconds(server.process.pid), window).spent())

    with engines.Service("service (zero backend)", ("--backend", "zero", *flags), env=pipeline.ZERO_BACKEND) as server:
        cell = pipeline.closed_loop(server.port, server.port_out, clients, batch, seconds, loaders, server.process.pid,
                                    during=read)
    requests = max(1.0, cell["requests_per_s"] * seconds)
    spent = {}
    for (stage, group, kind), used in sorted(used_by_thread[0].items()):
        spent.setdefault(f"{stage}, {group}", {})[f"{kind}_us"] = round(1e6 * used / requests, 1)
    return cell, spent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1, help="texts per request")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--loaders", type=int, default=2, help="client processes")
    parser.add_argument("--threads", action="store_true", help="CPU time by stage and thread, from /proc")
    parser.add_argument("flags", nargs="*", help="server flags, after --")
    args = parser.parse_args(argv)
    if args.threads:
        cell, threads = measure_threads(args.batch, args.clients, args.seconds, args.loaders, args.flags)
        print(json.dumps({"cell": cell, "us_per_request": threads}))
        print("| stage, threads | user µs per request | system µs |\n|---|---:|---:|")
        print("\n".join(f"| {name} | {times['user_us']:.0f} | {times['system_us']:.0f} |"
                        for name, times in threads.items()))
        return 0
    cell, shares = measure(args.batch, args.clients, args.seconds, args.loaders, args.flags)
    print(json.dumps({"cell": cell, "percent_of_cpu": shares}))
    print("\n".join(table(shares)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
