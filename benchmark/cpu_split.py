"""Where the CPU goes while the server carries requests (benchmark/pipeline.py's cells), on the zero
backend or, with `--model`, on a real model: `perf record -a` over one cell's window, split by process
(the clients, the ventilator, the sink, the workers, and ZeroMQ's I/O threads of them all) and by what
ran (the Python interpreter, the kernel, ZeroMQ, other native code such as numpy, orjson or libc), in
percent of all CPU time.

    python -m benchmark.cpu_split [--batch 1] [--clients 32] [--seconds 5] [--model M] [-- server flags]

It needs Linux `perf` and the right to record every CPU (root, or perf_event_paranoid at most 0).
With `--threads` it needs neither: it reads, from Linux's /proc, the user and system CPU time of
each stage's threads over the window, in µs per request, its own threads (the loop of the
ventilator and of the sink; a worker's intake, tokenizing threads and lanes, which all bear its
name) apart from ZeroMQ's (ZMQbg/...). With `--py-spy` it samples each of the server's processes
with py-spy (which needs the right to trace them: root, or their ancestor), the threads that hold
the GIL, and gives by stage the time its Python took per request (the rest of its CPU time went to
native code that let the GIL go) and the share of it each line and each of the server's functions
took.
"""
import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmark import engines, pipeline  # noqa: E402

PROCESSES = ("clients", "ventilator", "sink", "workers", "ZeroMQ I/O threads", "other", "idle")
KINDS = ("Python", "kernel", "ZeroMQ", "other native")
SAMPLES_PER_S = 499
SPY_RATE = 100  # py-spy's samples a second of each process, each pausing it (reads without a pause gave wrong lines)
TOP = 12  # functions a py-spy profile lists
OUR_CODE = re.compile(r"\(encoder_(server|client)/")
LAUNCHER = re.compile(r"\(encoder_server/(cli|server/supervisor|server/worker_pool)\.py\)")
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


def service(model=None, flags=()):
    """The server under test, started with `flags` beside its defaults: serving `model`, or without
    one on the zero backend."""
    if model:
        return engines.Service("service", tuple(flags), model)
    return engines.Service("service (zero backend)", ("--backend", "zero", *flags), env=pipeline.ZERO_BACKEND)


def watched_cell(batch, clients, seconds, loaders, flags, model, warmup, watch):
    """(the closed-loop cell's figures, what `watch(window, server_pid)` returned), the server as
    `service` starts it: `watch` runs on closed_loop's watcher thread over the cell's window (its
    wall-clock start and end), and what it raises is raised here."""
    outcome = []

    def during(window):
        try:
            outcome.append((True, watch(window, server.process.pid)))
        except Exception as error:  # raised again on the calling thread
            outcome.append((False, error))

    with service(model, flags) as server:
        cell = pipeline.closed_loop(server.port, server.port_out, clients, batch, seconds, loaders,
                                    server.process.pid, warmup, during=during)
    if not outcome:
        raise RuntimeError("the cell opened no window to watch")
    watched, value = outcome[0]
    if not watched:
        raise value
    return cell, value


def measure(batch=1, clients=32, seconds=5.0, loaders=2, flags=(), model=None, warmup=1.0):
    """(the cell's closed-loop figures, {process: {kind: percent}}), the server as `service` starts it."""
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "perf.data"
        cell, _ = watched_cell(batch, clients, seconds, loaders, flags, model, warmup,
                               lambda window, _: record(window, data))
        report = subprocess.run(["perf", "report", "-i", str(data), "--sort", "comm,dso", "--stdio"], check=True,
                                capture_output=True, text=True, timeout=300).stdout
    return cell, split(report)


def thread_seconds(server_pid):
    """{(stage, threads, "user" or "system"): CPU seconds so far} of the server's threads: "own" (those
    named as their process is), "ZeroMQ" (its I/O threads), or the name that others give themselves,
    digits left out (a CUDA driver's, say)."""
    import psutil
    totals = {}
    for process in pipeline.process_tree(server_pid):
        try:
            threads, name = process.threads(), process.name()
            stage = pipeline.stage_of(process)
        except psutil.Error:
            continue
        for thread in threads:
            group = _thread_group(_thread_name(process.pid, thread.id), name)
            for kind, seconds in (("user", thread.user_time), ("system", thread.system_time)):
                totals[stage, group, kind] = totals.get((stage, group, kind), 0.0) + seconds
    return totals


def _thread_group(thread_name, process_name):
    if thread_name.startswith(ZEROMQ_THREADS):
        return "ZeroMQ"
    if thread_name in ("", process_name):
        return "own"
    return re.sub(r"\d+", "", thread_name)


def _thread_name(pid, tid):
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return ""


def measure_threads(batch=1, clients=32, seconds=5.0, loaders=2, flags=(), model=None, warmup=1.0):
    """(the cell's closed-loop figures, {"stage, threads": {user_us, system_us} per request}), the
    server as `service` starts it."""
    cell, used_by_thread = watched_cell(
        batch, clients, seconds, loaders, flags, model, warmup,
        lambda window, server_pid: pipeline.CpuClock(lambda: thread_seconds(server_pid), window).spent())
    requests = max(1.0, cell["requests_per_s"] * seconds)
    spent = {}
    for (stage, group, kind), used in sorted(used_by_thread.items()):
        spent.setdefault(f"{stage}, {group}", {})[f"{kind}_us"] = round(1e6 * used / requests, 1)
    return cell, spent


def measure_py_spy(batch=1, clients=32, seconds=5.0, loaders=2, flags=(), model=None, warmup=1.0, rate=SPY_RATE):
    """(the cell's closed-loop figures, {stage: profile}), py-spy sampling each of the server's
    processes over the window, the server as `service` starts it: each stage's profile as `profile`
    gives it, with the µs per request its threads held the GIL (its Python's own work: the rest of its
    CPU time went to native code that let the GIL go, a wait in C among it) and the CPU µs per request
    of its threads as `thread_seconds` groups them. Where py-spy could not sample a process (no right
    to trace it, say), its stage says why, in "py_spy_error", beside its threads' CPU."""
    program, duration = py_spy(), max(1, round(seconds))  # py-spy's duration, in whole seconds
    stacks, errors = {}, {}

    def sample(window, server_pid):  # the CPU time of each thread, and each process's stacks
        clock = pipeline.CpuClock(lambda: thread_seconds(server_pid), window)
        time.sleep(max(0.0, window[0] - time.time()))
        with tempfile.TemporaryDirectory() as folder:
            spies = [(pipeline.stage_of(process), Path(folder) / f"{process.pid}.txt", process.pid)
                     for process in pipeline.process_tree(server_pid)]
            running = [(stage, out, subprocess.Popen(
                [program, "record", "--gil", "--rate", str(rate), "--duration", str(duration),
                 "--format", "raw", "--output", str(out), "--pid", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)) for stage, out, pid in spies]
            for stage, out, spy in running:
                _, said = spy.communicate(timeout=duration + 60)
                if spy.returncode:
                    errors[stage] = said.strip()[-500:] or f"exit code {spy.returncode}"
                else:
                    stacks[stage] = stacks.get(stage, "") + out.read_text()
        return clock.spent()

    cell, by_thread = watched_cell(batch, clients, seconds, loaders, flags, model, warmup, sample)
    requests = max(1.0, cell["requests_per_s"] * seconds)
    stages = {stage: {} for stage, _, _ in by_thread}
    for stage, raw in stacks.items():
        stages[stage] = profile(raw, rate * duration)
        stages[stage]["gil_us_per_request"] = round(1e6 * stages[stage]["gil_cores"] * seconds / requests)
    for stage, error in errors.items():
        stages.setdefault(stage, {})["py_spy_error"] = error
    for (stage, group, _), used in sorted(by_thread.items()):
        threads = stages[stage].setdefault("cpu_us_per_request_by_thread", {})
        threads[group] = round(threads.get(group, 0) + 1e6 * used / requests)
    return cell, stages


def py_spy():
    """The py-spy program: beside this interpreter (a virtual environment's), or on the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise RuntimeError("py-spy is not installed here: pip install py-spy (it comes with the benchmark extra)")
    return found


def profile(raw, samples_per_core, top=TOP):
    """{"gil_cores", "own": {line: percent}, "within": {function: percent}} from py-spy's raw output
    of samples of threads holding the GIL (a stack of frames, `function (file:line)` joined by `;`,
    and its count, a line each): the cores they kept busy (their samples over `samples_per_core`, what
    one thread holding it throughout gives), and the `top` by their share of the samples: the lines
    that ran, and the server's own functions (but its launcher's) that ran or called what ran, their
    lines merged."""
    own, within, total = Counter(), Counter(), 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        total += int(count)
        own[frames[-1]] += int(count)
        for function in {re.sub(r":\d+\)$", ")", frame) for frame in frames}:
            if OUR_CODE.search(function) and not LAUNCHER.search(function):
                within[function] += int(count)

    def shares(counter):
        return {frame: round(100 * count / total, 1) for frame, count in counter.most_common(top)}
    return {"gil_cores": round(total / samples_per_core, 3), "own": shares(own), "within": shares(within)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=1, help="texts per request")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--loaders", type=int, default=2, help="client processes")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds of load before the window opens")
    parser.add_argument("--model", help="serve this model instead of the zero backend")
    parser.add_argument("--threads", action="store_true", help="CPU time by stage and thread, from /proc")
    parser.add_argument("--py-spy", action="store_true", help="each stage's Python time and where it goes")
    parser.add_argument("flags", nargs="*", help="server flags, after --")
    args = parser.parse_args(argv)
    cell_args = (args.batch, args.clients, args.seconds, args.loaders, args.flags, args.model, args.warmup)
    if args.py_spy:
        cell, stages = measure_py_spy(*cell_args)
        print(json.dumps({"cell": cell, "profiles": stages}, indent=1))
        return 0
    if args.threads:
        cell, threads = measure_threads(*cell_args)
        print(json.dumps({"cell": cell, "us_per_request": threads}))
        print("| stage, threads | user µs per request | system µs |\n|---|---:|---:|")
        print("\n".join(f"| {name} | {times['user_us']:.0f} | {times['system_us']:.0f} |"
                        for name, times in threads.items()))
        return 0
    cell, shares = measure(*cell_args)
    print(json.dumps({"cell": cell, "percent_of_cpu": shares}))
    print("\n".join(table(shares)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
