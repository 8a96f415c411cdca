"""Reranking, and two models in one server, measured: the service's `rerank` (ZeroMQ client) against
sentence-transformers' CrossEncoder.predict in-process, on the same pairs and threads.

With --infinity, infinity's own server (`infinity_emb v2`, torch on the CPU) reranks the same pairs
over its /rerank route beside them.

The cross-encoder is MiniLM-L6-sized: the bundled all-MiniLM-L6-v2's encoder under a random
one-label head, saved by CrossEncoder (no cross-encoder ships in a package here;
cross-encoder/ms-marco-MiniLM-L6-v2 has the same shape, so the same cost), or --model DIR.

    python -m benchmark.rerank --repeats 3 --out benchmark/results/issue29-rerank

Cells (medians of --repeats rounds, pairs of a short query and medium documents):
- one query x 100 documents, and 16 concurrent queries x 50 documents: pairs per second;
- one query x 20 documents, one request at a time: p50 and p95 milliseconds;
- isolation: one server of an embedder (the bundled model) and the reranker, each on its share of
  the cores; p50 and p99 of rerank requests of 1 query x 5 documents alone, then while clients
  flood the embedder with requests of 256 texts;
- memory: the peak PSS of the whole server (every process) serving the embedder alone, and
  serving the embedder and the reranker, through the same requests.
"""
import argparse
import contextlib
import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from encoder_server.model.model_folder import default_model_path

from .corpus import texts as corpus_texts
from .engines import Infinity, Service


def minilm_cross_encoder(folder):
    """A CrossEncoder folder: the bundled model's encoder under a random one-label head."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    plain = Path(folder) / "plain"
    AutoModelForSequenceClassification.from_pretrained(str(default_model_path()), num_labels=1).save_pretrained(plain)
    AutoTokenizer.from_pretrained(str(default_model_path())).save_pretrained(plain)
    CrossEncoder(str(plain), device="cpu").save_pretrained(str(Path(folder) / "minilm-cross-encoder"))
    return Path(folder) / "minilm-cross-encoder"


def pairs_per_second(rerank, queries, documents, clients):
    """Pairs scored per second with `clients` threads, each reranking its queries' documents."""
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda query: rerank(query, documents), queries))
    return len(queries) * len(documents) / (time.perf_counter() - start)


def latencies_ms(rerank, query, documents, count):
    times = []
    for _ in range(count):
        start = time.perf_counter()
        rerank(query, documents)
        times.append((time.perf_counter() - start) * 1000)
    return times


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def throughput_round(service, cross_encoder, queries, documents, single, infinity=None):
    """Each engine's cells: `service` (ours), sentence-transformers in-process and, when it runs,
    `infinity` (an engines.Infinity)."""
    from encoder_client import EncoderClient

    local = threading.local()

    def served(query, docs):
        if not hasattr(local, "client"):
            local.client = EncoderClient("127.0.0.1", service.port, service.port_out, timeout=600)
        return local.client.rerank(query, docs)

    def in_process(query, docs):
        return cross_encoder.predict([(query, doc) for doc in docs], batch_size=32)

    def over_http(query, docs):
        import requests
        if not hasattr(local, "session"):
            local.session = requests.Session()
        reply = local.session.post(f"{infinity.url}/rerank", json={"model": "bench", "query": query,
                                                                   "documents": docs}, timeout=600)
        reply.raise_for_status()
        if len(reply.json()["results"]) != len(docs):
            raise RuntimeError("infinity returned the wrong number of scores")

    engines = [("service", served), ("sentence-transformers", in_process)]
    row = {}
    for name, rerank in engines + ([("infinity", over_http)] if infinity else []):
        row[name] = {"1x100": pairs_per_second(rerank, queries[:1], documents[:100], 1),
                     "16x50": pairs_per_second(rerank, queries[:16], documents[:50], 16)}
        times = latencies_ms(rerank, queries[0], documents[:20], single)
        row[name]["batch1_p50_ms"], row[name]["batch1_p95_ms"] = quantile(times, 0.5), quantile(times, 0.95)
    return row


def isolation_round(service, queries, documents, flood_texts, probes):
    from encoder_client import EncoderClient

    def probe():
        with EncoderClient("127.0.0.1", service.port, service.port_out, timeout=600) as client:
            client.rerank(queries[0], documents[:5], model="reranker")  # warm
            return latencies_ms(lambda q, d: client.rerank(q, d, model="reranker"), queries[1], documents[:5], probes)

    alone = probe()
    stop = threading.Event()

    def flood():
        with EncoderClient("127.0.0.1", service.port, service.port_out, timeout=600) as client:
            while not stop.is_set():
                client.encode(flood_texts, model="embedder")

    flooders = [threading.Thread(target=flood) for _ in range(2)]
    for thread in flooders:
        thread.start()
    time.sleep(2)  # the embedder's queue fills
    try:
        flooded = probe()
    finally:
        stop.set()
        for thread in flooders:
            thread.join()
    return {name: {"p50_ms": quantile(times, 0.5), "p99_ms": quantile(times, 0.99)}
            for name, times in (("alone", alone), ("embedder flooded", flooded))}


def memory_cell(folder, models, work, queries, documents):
    """Peak PSS (MB) of a server of the bundled embedder alone, and of one with the reranker beside it."""
    from encoder_client import EncoderClient

    peaks = {}
    for name, flags in (("embedder alone", ()), ("embedder and reranker", ("--models", str(models)))):
        with Service(name, flags=flags, log_dir=work) as service:
            with EncoderClient("127.0.0.1", service.port, service.port_out, timeout=600) as client:
                client.encode(documents)
                if flags:
                    client.rerank(queries[0], documents, model="reranker")
        peaks[name] = service.peak_pss_mb
    return peaks


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a CrossEncoder folder (default: MiniLM-L6-sized, random head)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--single", type=int, default=40, help="requests per batch-1 latency cell")
    parser.add_argument("--probes", type=int, default=200, help="rerank requests per isolation cell")
    parser.add_argument("--out", default="benchmark/results/issue29-rerank")
    parser.add_argument("--memory-only", action="store_true", help="measure memory alone, into --out's results")
    parser.add_argument("--infinity", help="infinity_emb's executable (in a venv of its own: pip install "
                                           "'infinity-emb[server,torch]' torch==2.13.0)")
    args = parser.parse_args(argv)
    import torch
    from sentence_transformers import CrossEncoder

    work = Path(tempfile.mkdtemp(prefix="bench-rerank-"))
    folder = Path(args.model) if args.model else minilm_cross_encoder(work)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    cross_encoder = CrossEncoder(str(folder), device="cpu")
    queries, documents = corpus_texts("short", 16, seed=29), corpus_texts("medium", 100, seed=29)
    models = work / "models.toml"
    models.write_text(f'[[models]]\nname = "embedder"\n\n[[models]]\nname = "reranker"\nmodel = "{folder}"\n')
    out = Path(args.out)
    if args.memory_only:
        result = json.loads((out / "results.json").read_text())
        result["memory_pss_mb"] = memory_cell(folder, models, work, queries, documents)
        return _write(out, result)
    rounds, isolation = [], []
    for _ in range(args.repeats):
        with Service("rerank", model=folder, log_dir=work) as service, \
                (Infinity(args.infinity, folder, log_dir=work) if args.infinity else contextlib.nullcontext()) as peer:
            rounds.append(throughput_round(service, cross_encoder, queries, documents, args.single, peer))
        with Service("two models", flags=("--models", str(models)), log_dir=work) as service:
            isolation.append(isolation_round(service, queries, documents, corpus_texts("medium", 256, seed=3),
                                             args.probes))
        print(json.dumps({"rerank": rounds[-1], "isolation": isolation[-1]}), flush=True)
    from .run import _machine

    result = {"cores": cores, "machine": _machine(),
              "model": str(args.model or "MiniLM-L6-sized cross-encoder (random head)"),
              "repeats": args.repeats, "rerank": _medians(rounds), "isolation": _medians(isolation),
              "memory_pss_mb": memory_cell(folder, models, work, queries, documents),
              "rounds": {"rerank": rounds, "isolation": isolation}}
    _write(out, result)


def _write(out, result):
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "RESULTS.md").write_text(table(result))
    print(table(result))


def _medians(rounds):
    return {engine: {cell: statistics.median(r[engine][cell] for r in rounds) for cell in rounds[0][engine]}
            for engine in rounds[0]}


def table(result):
    served, st = result["rerank"]["service"], result["rerank"]["sentence-transformers"]
    iso = result["isolation"]
    machine = result.get("machine", {})
    lines = [f"Reranking on {result['cores']} cores ({machine.get('cpu', '?')}, {machine.get('isa', '?')}, "
             f"{machine.get('date', '?')}), {result['model']}; medians of {result['repeats']} rounds.", "",
             "| pairs/s | 1 query x 100 docs | 16 queries x 50 docs | batch-1 (1 x 20 docs) p50 / p95 ms |",
             "|---|---|---|---|"]
    engines = [("service (rerank, ZeroMQ)", served), ("sentence-transformers CrossEncoder.predict", st)]
    if "infinity" in result["rerank"]:
        engines.append(("infinity /rerank (torch, HTTP)", result["rerank"]["infinity"]))
    for name, row in engines:
        lines.append(f"| {name} | {row['1x100']:.0f} | {row['16x50']:.0f} | "
                     f"{row['batch1_p50_ms']:.1f} / {row['batch1_p95_ms']:.1f} |")
    for name, row in engines[1:]:
        lines.append(f"| service / {name.split(' ')[0]} | {served['1x100'] / row['1x100']:.2f}x | "
                     f"{served['16x50'] / row['16x50']:.2f}x | |")
    lines += ["", "| rerank 1 x 5 docs on a two-model server | p50 ms | p99 ms |", "|---|---|---|"]
    for name, row in iso.items():
        lines.append(f"| {name} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} |")
    lines.append(f"| flooded / alone | {iso['embedder flooded']['p50_ms'] / iso['alone']['p50_ms']:.2f}x | "
                 f"{iso['embedder flooded']['p99_ms'] / iso['alone']['p99_ms']:.2f}x |")
    memory = result.get("memory_pss_mb")
    if memory:
        lines += ["", "| whole server, peak PSS | MB |", "|---|---|"]
        lines += [f"| {name} | {mb:.0f} |" for name, mb in memory.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
