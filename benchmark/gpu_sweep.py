"""The service on a CUDA device across worker counts and precisions, against sentence-transformers
in-process on the same device, for issue 31's goals 1 (fp16 faster than fp32), 2 (a default within
90% of the best configuration) and 4 (30,000 short texts/s, 2x sentence-transformers, batch-1 p50
of 3 ms), in one device call:

    python -m benchmark.gpu_sweep MODEL [--workers 4 8] [--wide-rows 256] [--seconds 5] [--repeats 1]
                                        [--services 8:fp16 8:fp16:eager 2:fp16:tok6 ...] [--baselines fp16]
                                        [--out FILE]

Each configuration is one server (`--device cuda --num-worker N`, with and without `--fp16`; the
most workers once more with `--max-batch-size` at --wide-rows, passes of up to that many rows, as
sentence-transformers runs them, against the default 64; or the configurations --services names,
such as without CUDA graphs, or with more threads tokenizing) under the loads of the issue's
table: 32 closed-loop clients sending 32 short texts; one client sending 20,000 short texts, then
4,000 medium ones, in requests of 256; one client sending 200 short texts one at a time (its p50 is
the batch-1 latency). sentence-transformers (fp32 and fp16, batch 256) takes the one-client lists,
first, so that the baseline is there even if the sweep is stopped early. Each load runs once as a
warm-up first (the closed loop for up to 2 s), so that every engine has met its shapes and captured
its CUDA graphs. A row per engine and load, printed as it is measured (JSON lines), and with --out
all rows so far with the device's name, written again after each row (a sweep stopped at a time
limit keeps what it measured). DEVICE=cpu runs the same on the CPU, fp32 only: a check of the
machinery.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmark import corpus, engines, load, pipeline  # noqa: E402

DEVICE = os.environ.get("DEVICE", "cuda")


def engines_to_run(model, workers, log_dir, wide_rows=0, services=None, baselines=None):
    """(name, maker of the engine, whether it runs in this process) of every engine: first the
    baseline, sentence-transformers with batches of 256, in fp32 and on cuda in fp16 (or in the
    `baselines` precisions named); then the service at each worker count in the same precisions,
    and with `wide_rows` the most workers again with passes of that many rows; or else the
    `services` named (parse_service)."""
    precisions = [False] + ([True] if DEVICE == "cuda" else [])
    if baselines is not None:
        precisions = [name == "fp16" for name in baselines]
    counts = [(count, None) for count in workers] + ([(max(workers), wide_rows)] if wide_rows else [])
    services = services or [_service(count, fp16, rows) for count, rows in counts for fp16 in precisions]
    return [(f"sentence-transformers, {_precision(fp16)}",
             lambda fp16=fp16: engines.sentence_transformers(model, os.cpu_count(), DEVICE, 256, fp16), True)
            for fp16 in precisions] + \
        [(name, lambda name=name, flags=flags: engines.Service(name, flags, model, log_dir), False)
         for name, flags in services]


def _service(count, fp16, rows=None, eager=False, tokenizers=None, lanes=None, prefetch=None, pinned=False):
    """(name, flags) of the service at `count` workers, in fp16 or not, `rows` a pass (None: the
    default), `eager`: without CUDA graphs (which torch on cuda runs by default), `tokenizers`
    threads tokenizing, `lanes` passes at once and `prefetch` bulk jobs held a lane in each worker
    (None: the defaults), `pinned`: its processes kept on CPUs of their own (--pin-cpus)."""
    name = ", ".join([f"{count} worker{'s' if count > 1 else ''}", _precision(fp16),
                      *([f"{rows} rows a pass"] if rows else []), *([f"{lanes} lanes"] if lanes else []),
                      *([f"{tokenizers} tokenizing"] if tokenizers else []),
                      *([f"{prefetch} jobs held a lane"] if prefetch else []), *(["no CUDA graphs"] if eager else []),
                      *(["pinned"] if pinned else [])])
    return name, ("--device", DEVICE, "--num-worker", str(count), *(("--fp16",) if fp16 else ()),
                  *(("--max-batch-size", str(rows)) if rows else ()), *(("--lanes", str(lanes)) if lanes else ()),
                  *(("--tokenizer-threads", str(tokenizers)) if tokenizers else ()),
                  *(("--prefetch-size", str(prefetch)) if prefetch else ()),
                  *(("--no-cuda-graphs",) if eager else ()), *(("--pin-cpus",) if pinned else ()))


# NAME then a number: _service's argument
SERVICE_OPTIONS = {"rows": "rows", "tok": "tokenizers", "lanes": "lanes", "prefetch": "prefetch"}


def parse_service(text):
    """A service configuration named as WORKERS:PRECISION[:eager][:pinned][:rowsN][:tokN][:lanesN][:prefetchN],
    such as 8:fp16:eager or 2:fp16:tok6:lanes2."""
    count, precision, *options = text.split(":")
    numbers, unknown = {}, []
    for option in options:
        prefix = option.rstrip("0123456789")
        if prefix in SERVICE_OPTIONS and option != prefix:
            numbers[SERVICE_OPTIONS[prefix]] = int(option[len(prefix):])
        elif option not in ("eager", "pinned"):
            unknown.append(option)
    if unknown or precision not in ("fp32", "fp16") or not count.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected "
                                         "WORKERS:fp32|fp16[:eager][:pinned][:rowsN][:tokN][:lanesN][:prefetchN]")
    return _service(int(count), precision == "fp16", eager="eager" in options, pinned="pinned" in options,
                    **numbers)


def _precision(fp16):
    return "fp16" if fp16 else "fp32"


def cells(seconds, short_count=20_000, medium_count=4_000):
    """(cell name, whether an in-process engine takes it, function of an engine giving one run's summary)."""
    short, medium = corpus.texts("short", short_count), corpus.texts("medium", medium_count)

    def closed_loop(engine):
        load.closed_loop(engine, short[:2048], 32, 32, min(seconds, 2.0), 0)  # the warm-up: shapes met, graphs captured
        return load.closed_loop(engine, short[:2048], 32, 32, seconds, 0)

    def one_client(texts, batch):
        def measure(engine):
            load.sequential(engine, texts, batch, 0)  # the warm-up
            return load.sequential(engine, texts, batch, 0)
        return measure
    return [("short, 32 clients x 32", False, closed_loop),
            (f"short, 1 client x {short_count} in 256s", True, one_client(short, 256)),
            (f"medium, 1 client x {medium_count} in 256s", True, one_client(medium, 256)),
            ("short, 1 client x 200 one at a time", False, one_client(short[:200], 1))]


def print_row(rows):
    print(json.dumps(rows[-1]), flush=True)


def sweep(to_run, loads, repeats, on_row=print_row):
    """A row per engine of `to_run` and cell of `loads` that it takes, each the median of `repeats`
    runs; `on_row` is given the rows so far after each one. A service's row also says how many
    cores each of its stages kept busy over the cell (warm-up included): workers that keep fewer
    busy than they have threads to tokenize and run are waiting on the GPU; and every row on cuda,
    how busy the GPU was."""
    rows = []
    for name, make, in_process in to_run:
        with make() as engine:
            for cell, for_in_process, measure in loads:
                if in_process and not for_in_process:
                    continue
                with BusyCores(None if in_process else engine.process.pid) as busy, GpuBusy() as gpu:
                    summary = load.median_of([measure(engine) for _ in range(repeats)])
                rows.append({"configuration": name, "cell": cell, "texts_per_s": summary["sentences_per_s"],
                             "p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"],
                             **({"busy_cores": busy.cores} if busy.cores else {}),
                             **({"gpu_busy_percent": gpu.percent} if gpu.percent is not None else {})})
                on_row(rows)
    return rows


class BusyCores:
    """Over a `with` block, the cores each stage of the server whose pid is given kept busy (its
    CPU seconds over the block's seconds), in `cores`; empty without a pid."""

    def __init__(self, server_pid):
        self.server_pid, self.cores = server_pid, {}

    def __enter__(self):
        self.started, self.before = time.monotonic(), self._read()
        return self

    def __exit__(self, *_):
        seconds, after = time.monotonic() - self.started, self._read()
        self.cores = {stage: round((spent - self.before.get(stage, 0.0)) / seconds, 2)
                      for stage, spent in after.items()}

    def _read(self):
        return pipeline.stage_cpu_seconds(self.server_pid, clients=False) if self.server_pid else {}


class GpuBusy:
    """Over a `with` block on cuda, the share of time the GPU ran a kernel, in `percent`: the mean of
    nvidia-smi's utilization.gpu read every 100 ms (None on the CPU, or without nvidia-smi)."""

    def __enter__(self):
        program = shutil.which("nvidia-smi") if DEVICE == "cuda" else None
        self.percent, self.process = None, program and subprocess.Popen(
            [program, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "100"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *_):
        if self.process:
            self.process.terminate()
            try:
                readings, _ = self.process.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a stuck nvidia-smi costs the column, not the sweep
                self.process.kill()
                readings, _ = self.process.communicate()
            self.percent = mean_reading(readings)


def mean_reading(readings):
    """The mean of the numbers in nvidia-smi's lines of one GPU's readings (None if none is)."""
    numbers = [float(line) for line in readings.split() if line.replace(".", "", 1).isdigit()]
    return round(sum(numbers) / len(numbers), 1) if numbers else None


def device_name():
    import torch
    return (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}" if DEVICE == "cuda"
            else f"cpu ({os.cpu_count()} cores)")


def default_workers():
    """The worker count a cuda server starts with here by default, for a model as small as the bundled
    one (None on the CPU)."""
    from encoder_server.model.cpus import default_cuda_workers, usable_cpus
    return default_cuda_workers(usable_cpus()) if DEVICE == "cuda" else None


def measure(model, workers, seconds=5.0, repeats=1, texts=(20_000, 4_000), log_dir=None, wide_rows=0,
            services=None, baselines=None, out=None):
    """The whole sweep: what `out` (a path) gets, written again after each row, so that a sweep
    stopped at a time limit leaves the rows it measured."""
    def on_row(rows):
        print_row(rows)
        if out:
            Path(out).write_text(json.dumps(result(rows), indent=1))

    def result(rows):
        return {"device": device_name(), "default_workers": default_workers(), "rows": rows}
    return result(sweep(engines_to_run(model, workers, log_dir, wide_rows, services, baselines),
                        cells(seconds, *texts), repeats, on_row))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--wide-rows", type=int, default=256,
                        help="the most workers once more with passes of up to this many rows (0: not)")
    parser.add_argument("--services", type=parse_service, nargs="+",
                        help="these configurations instead, each WORKERS:fp32|fp16[:eager][:pinned][:rowsN][:tokN]"
                             "[:lanesN][:prefetchN] (eager: without CUDA graphs; pinned: --pin-cpus; tok: threads "
                             "tokenizing in each worker; lanes: its passes at once; prefetch: bulk jobs it holds a "
                             "lane)")
    parser.add_argument("--baselines", nargs="*", choices=("fp32", "fp16"),
                        help="sentence-transformers in these precisions (default: fp32, and fp16 on cuda)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--texts", type=int, nargs=2, default=[20_000, 4_000], metavar=("SHORT", "MEDIUM"),
                        help="texts in the one-client lists")
    parser.add_argument("--out", help="a JSON file for every row")
    parser.add_argument("--log-dir", help="keep the servers' logs there (default: removed unless a start fails)")
    args = parser.parse_args(argv)
    measure(args.model, args.workers, args.seconds, args.repeats, args.texts, args.log_dir, args.wide_rows,
            args.services, args.baselines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
