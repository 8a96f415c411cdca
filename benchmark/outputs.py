"""Long texts and compact outputs, measured on one server of the bundled all-MiniLM-L6-v2.

    python -m benchmark.outputs --repeats 3 --out benchmark/results/issue30-outputs

- precision: the result bytes per text of each precision (1,000 medium texts), and the request's
  time, against float32's;
- retrieval: a labelled set made from the standard library's docstrings (benchmark.corpus's
  modules and more): each docstring of two sentences or more is a document without its first sentence,
  and that first sentence its query. For each precision (and `dimensions` 128 and 64), recall@10
  against float32 (how many of float32's top 10 documents it also ranks in its top 10) and hit@10
  (the query's own document in the top 10). Scores: dot products of the vectors as served, int8
  and uint8 dequantized with the ranges the server publishes, the binary forms by matching bits;
- long texts: p50 and p99 of one-text requests from one client, alone and while another client
  embeds a text of 50,000 tokens whole (long_texts="chunk"), and that text's own time.
"""
import argparse
import importlib
import json
import re
import statistics
import threading
import time
from pathlib import Path

import numpy as np

from .corpus import SOURCES
from .corpus import texts as corpus_texts
from .engines import Service

PRECISIONS = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
MORE_SOURCES = ("os", "shutil", "inspect", "io", "tarfile", "ftplib", "imaplib", "smtplib", "difflib", "textwrap",
                "decimal", "fractions", "calendar", "configparser", "tempfile", "glob", "ast", "heapq", "bisect",
                "contextlib", "dataclasses", "enum", "gzip", "hashlib", "locale", "mailbox", "pprint", "queue")


def labelled_set():
    """(queries, documents): each docstring's first sentence, and the rest of it."""
    queries, documents = [], []
    for name in SOURCES + MORE_SOURCES:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            doc = getattr(obj, "__doc__", None) if callable(obj) and getattr(obj, "__module__", None) == name else None
            if not isinstance(doc, str):
                continue
            sentences = re.split(r"(?<=[.!?])\s+", " ".join(doc.split()))
            if len(sentences) >= 2 and len(sentences[0]) > 20 and len(" ".join(sentences[1:])) > 40:
                queries.append(sentences[0])
                documents.append(" ".join(sentences[1:]))
    unique = dict(zip(documents, queries))  # a docstring inherited by several names counts once
    return list(unique.values()), list(unique)


def scores(queries, documents, precision, ranges):
    if precision in ("binary", "ubinary"):
        bits_q = np.unpackbits(queries.view(np.uint8), axis=1).astype(np.int32) * 2 - 1
        bits_d = np.unpackbits(documents.view(np.uint8), axis=1).astype(np.int32) * 2 - 1
        return bits_q @ bits_d.T  # matching bits less differing ones
    if precision in ("int8", "uint8"):
        queries, documents = dequantize(queries, ranges), dequantize(documents, ranges)
    return queries.astype(np.float32) @ documents.astype(np.float32).T


def dequantize(levels, ranges):
    """Each int8 or uint8 value as the middle of its step, in the ranges of the server's config."""
    starts, steps = (np.asarray(values, dtype=np.float32)[:levels.shape[1]] for values in ranges)
    return starts + (levels.astype(np.float32) + (128 if levels.dtype == np.int8 else 0) + 0.5) * steps


def top10(similarity):
    return np.argsort(-similarity, axis=1, kind="stable")[:, :10]


def retrieval(client, queries, documents):
    rows, reference = {}, None
    ranges = client.server_config["calibration"]["normalized"]
    variants = [(precision, None) for precision in PRECISIONS] + [("float32", 128), ("float32", 64),
                                                                  ("binary", 128)]
    for precision, dimensions in variants:
        q = client.encode(queries, precision=precision, dimensions=dimensions)
        d = client.encode(documents, precision=precision, dimensions=dimensions)
        best = top10(scores(q, d, precision, ranges))
        if reference is None:
            reference = best
        name = precision + (f", {dimensions} dims" if dimensions else "")
        rows[name] = {"recall@10 vs float32": round(float(np.mean([len(set(a) & set(b)) / 10
                                                                  for a, b in zip(best, reference)])), 4),
                      "hit@10": round(float(np.mean([i in best[i] for i in range(len(queries))])), 4),
                      "bytes per vector": int(d[0].nbytes)}
    return rows


def sizes(client, repeats):
    texts = corpus_texts("medium", 1000, seed=30)
    rows = {}
    for precision in PRECISIONS:
        times, nbytes = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            array = client.encode(texts, precision=precision)
            times.append(time.perf_counter() - start)
            nbytes = array.nbytes
        rows[precision] = {"bytes per text": nbytes / len(texts), "seconds (median)": round(statistics.median(times), 3)}
    for row in rows.values():
        row["bytes vs float32"] = round(row["bytes per text"] / rows["float32"]["bytes per text"], 4)
    return rows


def latencies(client, count):
    out = []
    for text in corpus_texts("short", count, seed=31):
        start = time.perf_counter()
        client.encode([text])
        out.append((time.perf_counter() - start) * 1000)
    return out


def long_text(service, repeats):
    words = " ".join(corpus_texts("long", 400, seed=32)).split()
    text = " ".join(words[:27_000])  # about 50,000 tokens of the bundled model
    with service.client()._client as prober, service.client()._client as other:
        alone = latencies(prober, 300)
        results, during, done = [], [], threading.Event()

        def embed_whole():
            for _ in range(repeats):
                start = time.perf_counter()
                reply = other.encode_result([text], long_texts="chunk")
                results.append((time.perf_counter() - start, reply.windows[0], reply.num_tokens))
            done.set()

        thread = threading.Thread(target=embed_whole)
        thread.start()
        while not done.is_set():
            during += latencies(prober, 20)
        thread.join()

    def summary(values):
        return {"p50 ms": round(statistics.median(values), 2),
                "p99 ms": round(float(np.percentile(values, 99)), 2), "requests": len(values)}
    return {"one-text requests alone": summary(alone), "one-text requests meanwhile": summary(during),
            "the long text": {"windows": results[0][1], "tokens computed": results[0][2],
                              "seconds (median)": round(statistics.median(r[0] for r in results), 2)}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    queries, documents = labelled_set()
    results = {"cpu flags": _cpu_flags(), "labelled set": {"queries": len(queries), "documents": len(documents)}}
    with Service("encoder-server") as service:
        client = service.client()._client
        results["precision"] = sizes(client, args.repeats)
        results["retrieval"] = retrieval(client, queries, documents)
        client.close()
        results["long text"] = long_text(service, args.repeats)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def _cpu_flags():
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0]
    return " ".join(flag for flag in ("avx2", "avx512f", "avx512_vnni", "avx_vnni") if f" {flag}" in flags)


if __name__ == "__main__":
    main()
