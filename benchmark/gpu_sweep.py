"""The service on a CUDA device across worker counts and precisions, for issue 31's goals 1 (fp16
faster than fp32) and 2 (a default within 90% of the best configuration), in one device call:

    python -m benchmark.gpu_sweep MODEL [--workers 1 2 4 8] [--seconds 5] [--repeats 1] [--out FILE]

Each configuration is one server (`--device cuda --num-worker N`, with and without `--fp16`) under
three loads: 32 closed-loop clients sending 32 short texts, one client sending 2,000 medium texts
in requests of 256, and one client sending 200 short texts one at a time (its p50 is the batch-1
latency). A row per configuration and load, printed as it is measured (JSON lines), and with
--out all rows with the device's name. DEVICE=cpu runs the same on the CPU, fp32 only: a check of
the machinery.
"""
import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmark import corpus, engines, load  # noqa: E402

DEVICE = os.environ.get("DEVICE", "cuda")


def configurations(workers):
    """(name, server flags) of every configuration: each worker count in fp32, and on cuda in fp16."""
    precisions = [("fp32", ())] + ([("fp16", ("--fp16",))] if DEVICE == "cuda" else [])
    return [(f"{count} worker{'s' if count > 1 else ''}, {precision}",
             ("--device", DEVICE, "--num-worker", str(count), *flags))
            for count in workers for precision, flags in precisions]


def loads(seconds):
    """(cell name, function of an engine giving one run's summary)."""
    short, medium = corpus.texts("short", 2048), corpus.texts("medium", 2000)
    return [("short, 32 clients x 32", lambda engine: load.closed_loop(engine, short, 32, 32, seconds, 0)),
            ("medium, 1 client x 2000 in 256s", lambda engine: load.sequential(engine, medium, 256, 0)),
            ("short, 1 client x 200 one at a time", lambda engine: load.sequential(engine, short[:200], 1, 0))]


def sweep(model, workers, seconds, repeats, log_dir):
    rows = []
    for name, flags in configurations(workers):
        with engines.Service(name, flags, model, log_dir) as engine:
            for cell, measure in loads(seconds):
                summary = load.median_of([measure(engine) for _ in range(repeats)])
                rows.append({"configuration": name, "cell": cell, "texts_per_s": summary["sentences_per_s"],
                             "p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"]})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def device_name():
    import torch
    return torch.cuda.get_device_name(0) if DEVICE == "cuda" else f"cpu ({os.cpu_count()} cores)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", help="a JSON file for every row")
    parser.add_argument("--log-dir", default="/tmp")
    args = parser.parse_args(argv)
    rows = sweep(args.model, args.workers, args.seconds, args.repeats, args.log_dir)
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
