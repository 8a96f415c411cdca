"""Bulk embedding throughput, three ways in one run, on the same Parquet file of medium texts:
`encoder-server bulk` on a local Ray, `EncoderClient.encode(show_progress=True)` against a local
server, and `SentenceTransformer.encode`. Each reports texts per second and the peak memory of
its process tree (RSS and PSS); then `bulk` again on a two-node Ray cluster on this host, to show
how the shards split between the nodes. Ray's own fixed cost (starting a local cluster and its
actors, and stopping them) is `bulk` on a file of a few texts; the bulk row less that cost is the
steady rate a longer file approaches.

    python -m benchmark.bulk --texts 100000 --repeats 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from encoder_server.model.model_folder import default_model_path

from .corpus import texts as corpus_texts
from .engines import ROOT, RssSampler, Service


def timed_process(command, env=None):
    """(seconds, peak RSS MB, peak PSS MB, stdout) of a command run to its end."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT,
                               env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    sampler = RssSampler(process.pid)
    out, _ = process.communicate()
    seconds = time.perf_counter() - start
    peak = sampler.stop()
    if process.returncode:
        raise RuntimeError(f"{command} exited with {process.returncode}")
    return seconds, peak, round(sampler.peak_pss_mb, 1), out


def bulk_once(source, work, shard_rows, extra=()):
    output = Path(tempfile.mkdtemp(dir=work))
    return timed_process([sys.executable, "-m", "encoder_server.cli", "bulk", str(source), str(output), "--quiet",
                          "--shard-rows", str(shard_rows), *extra])


def client_once(texts, work):
    from encoder_client import EncoderClient

    with Service("service", log_dir=work) as server:
        with EncoderClient("127.0.0.1", server.port, server.port_out, timeout=900) as client:
            start = time.perf_counter()
            client.encode(texts, show_progress=True)
            seconds = time.perf_counter() - start
    return seconds, server.peak_rss_mb, server.peak_pss_mb


SENTENCE_TRANSFORMERS = """
import sys, time, pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer
texts = pq.read_table(sys.argv[1]).column("text").to_pylist()
model = SentenceTransformer(sys.argv[2], device="cpu")
start = time.perf_counter(); model.encode(texts, batch_size=32); print(time.perf_counter() - start)
"""


def sentence_transformers_once(source):
    _, peak, pss, out = timed_process([sys.executable, "-c", SENTENCE_TRANSFORMERS, str(source),
                                       str(default_model_path())])
    return float(out.strip().splitlines()[-1]), peak, pss


def two_node_split(source, work, shard_rows):
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        seconds, _, _, out = bulk_once(source, work, shard_rows, ["--ray-address", cluster.address, "--actors", "2"])
    finally:
        cluster.shutdown()
    return seconds, out.split("shards written per Ray node: ")[1].splitlines()[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shard-rows", type=int, help="default: texts / 16, at most 10,000, so every actor works")
    args = parser.parse_args(argv)
    shard_rows = args.shard_rows or min(10_000, max(100, args.texts // 16))
    work = tempfile.mkdtemp(prefix="bench-bulk-")
    texts = corpus_texts("medium", args.texts)
    source = Path(work) / "medium.parquet"
    pq.write_table(pa.table({"text": texts}), source)
    tiny = Path(work) / "tiny.parquet"
    pq.write_table(pa.table({"text": texts[:8]}), tiny)
    runs = {"bulk (local Ray)": [], "EncoderClient.encode(show_progress=True)": [], "SentenceTransformer.encode": []}
    fixed = []
    for _ in range(args.repeats):               # interleaved, so drift hits all three alike
        seconds, peak, pss, _ = bulk_once(source, work, shard_rows)
        runs["bulk (local Ray)"].append((seconds, peak, pss))
        fixed.append(bulk_once(tiny, work, shard_rows)[0])
        runs["EncoderClient.encode(show_progress=True)"].append(client_once(texts, work))
        runs["SentenceTransformer.encode"].append(sentence_transformers_once(source))
    report = {name: {"texts_per_s": round(args.texts / statistics.median(r[0] for r in rows), 1),
                     "runs_texts_per_s": [round(args.texts / r[0], 1) for r in rows],
                     "peak_rss_mb": max(r[1] for r in rows), "peak_pss_mb": max(r[2] for r in rows)}
              for name, rows in runs.items()}
    ray_fixed_s = statistics.median(fixed)
    bulk_s = statistics.median(r[0] for r in runs["bulk (local Ray)"])
    report["bulk (local Ray), less Ray's fixed cost"] = {"texts_per_s": round(args.texts / (bulk_s - ray_fixed_s), 1)}
    base = report["EncoderClient.encode(show_progress=True)"]["texts_per_s"]
    for row in report.values():
        row["vs_client"] = round(row["texts_per_s"] / base, 2)
    seconds, split = two_node_split(source, work, shard_rows)
    report["bulk, two-node Ray cluster on this host"] = {"texts_per_s": round(args.texts / seconds, 1),
                                                         "shards_per_node": split}
    print(json.dumps({"texts": args.texts, "kind": "medium", "cpus": os.cpu_count(),
                      "ray_fixed_s": round(ray_fixed_s, 1), "results": report}, indent=1))


if __name__ == "__main__":
    main()
