"""Throughput of the service against the same model in-process, measured in one run.

    python benchmark/throughput.py [--texts 512] [--repeats 3] [--words 50]

Engines: sentence-transformers `encode` (batch 32), our torch backend called in-process (no
sockets), and the service with 1 worker x 2 threads and 2 workers x 1 thread, each fed by one
client sending the whole list. Prints and saves sentences/s (median of the repeats) and ratios
against sentence-transformers; writes benchmark/results/throughput.json and benchmark/RESULTS.md.
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from encoder_client import EncoderClient  # noqa: E402


def corpus(count, words, seed=0):
    """Deterministic English-like text made from this file's and the stdlib's docstrings."""
    vocabulary = " ".join(filter(None, (json.__doc__, argparse.__doc__, statistics.__doc__, __doc__))).split()
    rng = random.Random(seed)
    return [" ".join(rng.choices(vocabulary, k=words)) for _ in range(count)]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def timed(function, repeats):
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def sentence_transformers_run(model, texts, repeats):
    from sentence_transformers import SentenceTransformer
    encoder = SentenceTransformer(str(model), device="cpu")
    encoder.encode(texts[:32])
    return timed(lambda: encoder.encode(texts, batch_size=32), repeats)


def in_process_run(settings, texts, repeats):
    from encoder_server.backends import load_encoder
    from encoder_server.batching import BatchPlanner, drain
    from encoder_server.scheduling import Job
    from encoder_server.tokenizer import TextTokenizer
    tokenizer, encoder = TextTokenizer(settings.model, settings.truncate_at), load_encoder(settings)

    def run():
        planner = BatchPlanner(settings.max_batch_tokens, settings.max_batch_size, tokenizer.pad_id)
        for start in range(0, len(texts), settings.max_batch_size):
            planner.add(tokenizer.tokenize(Job(job_id=start, seq=0, offset=start,
                                               texts=texts[start:start + settings.max_batch_size])))
        drain(planner, encoder.embed)
    run()
    return timed(run, repeats)


def service_run(texts, repeats, workers, threads):
    port, port_out = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "encoder_server.cli", "start", "--port", str(port),
                               "--port-out", str(port_out), "--num-worker", str(workers),
                               "--threads-per-worker", str(threads)], cwd=HERE.parent,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                with EncoderClient("127.0.0.1", port, port_out, timeout=2) as probe:
                    if probe.server_status["ready"]:
                        break
            except TimeoutError:
                time.sleep(0.5)
        with EncoderClient("127.0.0.1", port, port_out, timeout=600) as client:
            client.encode(texts[:32])
            return timed(lambda: client.encode(texts), repeats)
    finally:
        server.terminate()
        server.wait(60)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--words", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from encoder_server.settings import resolve
    cpus = len(os.sched_getaffinity(0))
    settings = resolve(threads_per_worker=cpus)
    texts = corpus(args.texts, args.words)
    seconds = {
        "sentence-transformers (in-process)": sentence_transformers_run(settings.model, texts, args.repeats),
        "torch backend (in-process)": in_process_run(settings, texts, args.repeats),
        "service, 1 worker x 2 threads": service_run(texts, args.repeats, 1, 2),
        "service, 2 workers x 1 thread": service_run(texts, args.repeats, 2, 1),
    }
    baseline = args.texts / seconds["sentence-transformers (in-process)"]
    rows = [{"engine": name, "sentences_per_s": round(args.texts / s, 1),
             "ratio_to_sentence_transformers": round(args.texts / s / baseline, 3)} for name, s in seconds.items()]
    results = {"texts": args.texts, "words_per_text": args.words, "repeats": args.repeats,
               "cpus": cpus, "rows": rows}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "throughput.json").write_text(json.dumps(results, indent=2))
    table = ["| engine | sentences/s (median) | ratio to sentence-transformers |", "|---|---|---|"]
    table += [f"| {r['engine']} | {r['sentences_per_s']} | {r['ratio_to_sentence_transformers']:.2f} |" for r in rows]
    print("\n".join(table))
    (HERE / "RESULTS.md").write_text(
        f"# Throughput\n\nBundled all-MiniLM-L6-v2, {args.texts} texts of {args.words} words, one client, "
        f"{cpus} CPU cores, median of {args.repeats} runs, all engines measured in the same run "
        f"(`python benchmark/throughput.py --texts {args.texts} --words {args.words} --repeats {args.repeats}`). Compare ratios, not absolute "
        "figures: one engine varies by about 10% between processes.\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
