"""In-process peers, each run in an interpreter of its own: FastEmbed on an ONNX export of the
model, and sentence-transformers on its ONNX backend, in fp32 and with its own dynamic int8 export.

sentence-transformers' ONNX backend needs optimum-onnx, which pins transformers 4.x, so the peers
live in a virtual environment apart from ours:

    python3 -m venv /opt/peers
    /opt/peers/bin/pip install torch==2.13.0 "sentence-transformers[onnx]" fastembed numpy
    python -m benchmark.run --only peers --peer-python /opt/peers/bin/python

`Peer` starts `python -m benchmark.peers ENGINE MODEL WORKDIR` under that interpreter. The child
exports what its engine needs into WORKDIR (once), loads the engine, says "ready", then answers each
JSON request read from stdin with one JSON line: a measurement (see `measure`) or embeddings.
The same `measure` runs our own engines in the parent, so every engine is timed by the same code.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmark import corpus, load  # noqa: E402

ENGINES = {"st": "sentence-transformers, torch (in-process)",
           "fastembed": "FastEmbed (onnx fp32, in-process)",
           "fastembed-16": "FastEmbed, batch 16 (onnx fp32, in-process)",
           "st-onnx": "sentence-transformers, onnx backend (in-process)",
           "st-int8": "sentence-transformers, its own onnx int8 (in-process)"}
START_TIMEOUT = 600


def measure(engine, request):
    """One measurement of `engine` (an object with `client()`): a dict from `load`.
    request: {"pattern": "sequential", "kind", "count", "batch", "tokens"} or
             {"pattern": "closed_loop", "kind", "clients", "batch", "seconds", "tokens"}."""
    if request["pattern"] == "sequential":
        texts = corpus.texts(request["kind"], request["count"])
        return load.sequential(engine, texts, request["batch"], request["tokens"])
    texts = corpus.texts(request["kind"], 2048)
    return load.closed_loop(engine, texts, request["clients"], request["batch"], request["seconds"],
                            request["tokens"])


def cells(texts=1024, clients=8, batch=16, seconds=5.0, single=300):
    """The issue-28 comparison: name -> request (without "tokens", which the caller adds)."""
    cells = {}
    for kind in ("short", "medium"):
        cells[f"{kind}, 1 client x {texts}"] = {"pattern": "sequential", "kind": kind, "count": texts, "batch": texts}
        cells[f"{kind}, {clients} clients x {batch}"] = {"pattern": "closed_loop", "kind": kind, "clients": clients,
                                                         "batch": batch, "seconds": seconds}
    for kind in ("short", "long"):
        cells[f"{kind}, 1 text per request"] = {"pattern": "sequential", "kind": kind, "count": single, "batch": 1}
    return cells


def compare(engines, cells, tokens, rounds):
    """Every engine on every cell, engines alternated within each round, each round in the other
    order (load.turn_orders). engines: name -> a function measuring one request. Returns the rows,
    one per engine, cell and round."""
    rows = []
    for round_, turn in enumerate(load.turn_orders(list(engines), rounds)):
        for name in turn:
            for cell, request in cells.items():
                rows.append({"engine": name, "cell": cell, "round": round_,
                             **engines[name]({**request, "tokens": tokens[request["kind"]]})})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def summarize(rows, baseline):
    """Per engine and cell: the medians over rounds, and the median over rounds of the baseline
    engine's throughput divided by this engine's (each ratio within one round)."""
    import statistics
    out = []
    for engine, cell in dict.fromkeys((row["engine"], row["cell"]) for row in rows):
        mine = [row for row in rows if row["engine"] == engine and row["cell"] == cell]
        ratios = []
        for row in mine:
            base = next((b for b in rows if b["engine"] == baseline and b["cell"] == cell
                         and b["round"] == row["round"]), None)
            if base and row["sentences_per_s"]:
                ratios.append(base["sentences_per_s"] / row["sentences_per_s"])
        out.append({"engine": engine, "cell": cell, "rounds": len(mine),
                    **{key: round(statistics.median(row[key] for row in mine), 1)
                       for key in ("sentences_per_s", "p50_ms", "p95_ms")},
                    "baseline_over_this": round(statistics.median(ratios), 2) if ratios else None})
    return out


class Peer:
    """The parent's handle on a peer process: `measure(request)`, `embed(texts)`."""

    def __init__(self, python, engine, model, workdir):
        self.name = ENGINES[engine]
        self.command = [str(python), "-m", "benchmark.peers", engine, str(model), str(workdir)]
        self.peak_rss_mb = None

    def __enter__(self):
        self.process = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT,
                                        env={**os.environ, "HF_HUB_OFFLINE": "1"}, text=True)
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.__exit__()
            raise RuntimeError(f"{self.name} did not start (exit code {self.process.poll()})")
        return self

    def __exit__(self, *_):
        self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _ask(self, request):
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited with code {self.process.wait()}")
        return json.loads(line)

    def measure(self, request):
        return self._ask(request)

    def embed(self, texts):
        import numpy as np
        return np.array(self._ask({"embed": texts}), dtype=np.float32)


# ----- the child: one engine, loaded in this interpreter -----

class _InProcess:
    def __init__(self, encode):
        self.encode = encode

    def client(self):
        return self

    def close(self):
        pass


def _st_onnx_folder(model, workdir):
    """The model with sentence-transformers' own ONNX export (onnx/model.onnx) beside it."""
    from sentence_transformers import SentenceTransformer
    folder = Path(workdir) / "st-onnx"
    if not (folder / "onnx" / "model.onnx").exists():
        SentenceTransformer(str(model), device="cpu", backend="onnx").save_pretrained(str(folder))
    return folder


def _sentence_transformers_torch(model):
    from sentence_transformers import SentenceTransformer
    encoder = SentenceTransformer(str(model), device="cpu")
    return lambda texts: encoder.encode(texts, batch_size=32)


def _sentence_transformers_onnx(model, workdir, int8):
    from sentence_transformers import SentenceTransformer, export_dynamic_quantized_onnx_model
    folder = _st_onnx_folder(model, workdir)
    kwargs = {"model_kwargs": {"file_name": "onnx/model.onnx"}}  # the int8 file may sit beside it
    if int8:
        config = "avx512_vnni" if "avx512_vnni" in Path("/proc/cpuinfo").read_text() else "avx2"
        exported = lambda: sorted(folder.glob(f"onnx/model_q*int8_{config}.onnx"))  # noqa: E731 (quint8 on avx2)
        if not exported():
            export_dynamic_quantized_onnx_model(SentenceTransformer(str(folder), device="cpu", backend="onnx"),
                                                config, str(folder))
        kwargs = {"model_kwargs": {"file_name": str(exported()[0].relative_to(folder))}}
    encoder = SentenceTransformer(str(folder), device="cpu", backend="onnx", **kwargs)
    return lambda texts: encoder.encode(texts, batch_size=32)


def _fastembed(model, workdir, batch_size=256):
    """FastEmbed's custom-model API on sentence-transformers' fp32 export: mean pooling and
    normalization as the model's own modules say, nothing downloaded. Its default batch is 256;
    on a 2-core AVX2 VM it ran 2-3x faster at 16, so that is measured too."""
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType
    folder = Path(workdir) / "fastembed"
    if not (folder / "model.onnx").exists():
        shutil.copytree(model, folder, dirs_exist_ok=True)
        shutil.copy(_st_onnx_folder(model, workdir) / "onnx" / "model.onnx", folder / "model.onnx")
    dimension = json.loads((Path(model) / "config.json").read_text())["hidden_size"]
    TextEmbedding.add_custom_model(model="local/benchmark-model", pooling=PoolingType.MEAN, normalization=True,
                                   sources=ModelSource(hf="local/benchmark-model"), dim=dimension,
                                   model_file="model.onnx")
    encoder = TextEmbedding("local/benchmark-model", specific_model_path=str(folder),
                            threads=len(os.sched_getaffinity(0)))
    return lambda texts: list(encoder.embed(texts, batch_size=batch_size))


def _serve(engine, model, workdir):
    answer = sys.stdout
    sys.stdout = sys.stderr  # the engines' own prints must not reach the protocol
    encode = {"st": lambda: _sentence_transformers_torch(model),
              "fastembed": lambda: _fastembed(model, workdir),
              "fastembed-16": lambda: _fastembed(model, workdir, batch_size=16),
              "st-onnx": lambda: _sentence_transformers_onnx(model, workdir, int8=False),
              "st-int8": lambda: _sentence_transformers_onnx(model, workdir, int8=True)}[engine]()
    encode(["warm up the model", "a second, longer sentence to warm up the model"])
    print("ready", file=answer, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "embed" in request:
            reply = [[float(x) for x in row] for row in encode(request["embed"])]
        else:
            reply = measure(_InProcess(encode), request)
        print(json.dumps(reply), file=answer, flush=True)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _serve(*sys.argv[1:4])
