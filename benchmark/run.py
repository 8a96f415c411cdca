"""The benchmark suite: our service against sentence-transformers, infinity and our own backend
in-process, on the same texts and model, in one run.

    python -m benchmark.run                      # full suite, bundled model (about 36 minutes on 2 cores)
    python -m benchmark.run --smoke --model DIR --out DIR   # seconds-scale check of the machinery

Writes results.json and PNG plots to --out (default benchmark/results) and the RESULTS.md table
generated from them: benchmark/RESULTS.md for the default --out, else next to the results.
Figures are medians of --repeats runs.
"""
import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmark import corpus, engines, load, peers, report  # noqa: E402


SCENARIOS = ("client_batches", "latency", "memory", "concurrency", "tiny_clients", "fairness", "variants", "graphs",
             "accuracy", "ceiling", "peers", "pipeline", "gpu")
SLOW = ("variants", "accuracy")  # run last, and only where the plan measures variants (not --smoke)


@dataclass
class Plan:
    kinds: tuple = ("short", "medium", "long")
    batches: tuple = (1, 16, 256, 4096)
    texts: dict = field(default_factory=lambda: {"short": 512, "medium": 256, "long": 96})
    single_requests: int = 48            # requests of one text, for the batch-1 cells
    one_repeat_above: int = 2048         # texts per cell above which one run is all we can afford
    concurrency: tuple = (1, 4, 16, 64)
    concurrency_batch: int = 16
    window_s: float = 5.0
    repeats: int = 3
    probe_requests: int = 200
    flood_s: float = 15.0
    variants: bool = True
    sentence_transformers: bool = True
    quantized: bool = True
    peer_cells: dict = field(default_factory=dict)  # benchmark.peers.cells' arguments


SMOKE = Plan(kinds=("short",), batches=(1, 16), texts={"short": 32}, single_requests=4, concurrency=(1, 4),
             concurrency_batch=4, window_s=0.5, repeats=1, probe_requests=10, flood_s=1.0, variants=False,
             sentence_transformers=False, quantized=False,
             peer_cells={"texts": 16, "clients": 2, "batch": 4, "seconds": 0.5, "single": 4})


class Suite:
    def __init__(self, plan, model, infinity, log_dir, peer_python=sys.executable, peer_engines=()):
        self.plan, self.model, self.infinity, self.log_dir = plan, model, infinity, log_dir
        self.peer_python, self.peer_engines = peer_python, peer_engines
        self.tokens = {kind: _mean_tokens(model, corpus.texts(kind, 256)) for kind in plan.kinds}

    def service(self, name, *flags):
        return engines.Service(name, flags, model=self.model, log_dir=self.log_dir)

    def served(self):
        """The servers every sweep runs: our defaults, and int8."""
        configs = [self.service("service (onnx fp32, defaults)")]
        if self.plan.quantized:
            configs.append(self.service("service (onnx int8)", "--quantize", "int8"))
        return configs

    # ----- scenarios -----

    def client_batches(self):
        """One client, the whole corpus in requests of 1..4096 texts. The engines are all up at once
        and take turns on each cell (load.taking_turns)."""
        from encoder_server.settings import resolve
        rows = []
        baseline = [engines.sentence_transformers(self.model, _cores())] if self.plan.sentence_transformers else []
        ours = engines.our_backend(resolve(model=self.model, num_worker=1, threads_per_worker=_cores()))
        with contextlib.ExitStack() as stack:
            running = [stack.enter_context(engine) for engine in [*baseline, ours, *self.served()]]
            for kind in self.plan.kinds:
                for batch in self.plan.batches:
                    count = self.plan.single_requests if batch == 1 else max(batch, self.plan.texts[kind])
                    texts = corpus.texts(kind, count)
                    repeats = 1 if count > self.plan.one_repeat_above and kind != "short" else self.plan.repeats
                    medians = load.taking_turns(
                        running, lambda engine: load.sequential(engine, texts, batch, self.tokens[kind]), repeats)
                    for engine, median in zip(running, medians):
                        rows.append({"engine": engine.name, "kind": kind, "batch": batch, "texts": count,
                                     "repeats": repeats, **median})
                        _progress(rows[-1])
        for engine in running:
            _note_rss(rows, engine)
        return rows

    def concurrency(self):
        """Closed-loop clients, each sending `concurrency_batch` medium texts per request. The servers
        are all up at once and take turns on each client count (load.taking_turns)."""
        kind = "medium" if "medium" in self.plan.kinds else self.plan.kinds[0]
        texts = corpus.texts(kind, 2048 if self.plan.sentence_transformers else 64)
        servers = self.served() + ([engines.Infinity(self.infinity, self.model, self.log_dir)] if self.infinity else [])
        rows = []
        with contextlib.ExitStack() as stack:
            running = []
            for server in servers:
                try:
                    running.append(stack.enter_context(server))
                except RuntimeError as error:  # a peer that does not start is reported, not fatal
                    print(f"# skipped: {error}", flush=True)
            for clients in self.plan.concurrency:
                in_flight = clients * self.plan.concurrency_batch
                warmup = min(10.0, 0.5 + in_flight / 100)
                window = max(self.plan.window_s, 1.5 * in_flight / 100)
                medians = load.taking_turns(
                    running, lambda engine: load.closed_loop(engine, texts, clients, self.plan.concurrency_batch,
                                                             window, self.tokens[kind], warmup=warmup),
                    self.plan.repeats)
                for engine, median in zip(running, medians):
                    rows.append({"engine": engine.name, "kind": kind, "clients": clients,
                                 "batch": self.plan.concurrency_batch, **median})
                    _progress(rows[-1])
        for engine in running:
            _note_rss(rows, engine)
        return rows

    def tiny_clients(self):
        """16 clients sending one short text per request, against one client sending 256 at a time."""
        texts = corpus.texts("short", 1024 if self.plan.sentence_transformers else 64)
        with self.service("service (onnx fp32, defaults)") as engine:
            single = load.median_of([load.sequential(engine, texts, min(256, len(texts)), self.tokens["short"])
                                     for _ in range(self.plan.repeats)])
            many = load.median_of([load.closed_loop(engine, texts, 16, 1, self.plan.window_s, self.tokens["short"])
                                   for _ in range(self.plan.repeats)])
        return {"single_client_batch_256": single, "sixteen_clients_batch_1": many,
                "ratio": round(many["sentences_per_s"] / single["sentences_per_s"], 3)}

    def fairness(self):
        """A one-text client's latency on an idle server, then while 4 clients flood 4096-text requests."""
        probe_texts = corpus.texts("short", self.plan.probe_requests)
        flood_kind = "medium" if "medium" in self.plan.kinds else self.plan.kinds[0]
        flood_texts = corpus.texts(flood_kind, 4096)
        with self.service("service (onnx fp32, defaults)", "--drain-timeout", "1") as engine:
            idle = _probe(engine, probe_texts, self.tokens["short"])
            stop = threading.Event()
            flooders = [threading.Thread(target=_flood, args=(engine, flood_texts, stop), daemon=True)
                        for _ in range(4)]
            for thread in flooders:
                thread.start()
            time.sleep(2.0)  # let the queues fill
            loaded = _probe(engine, probe_texts, self.tokens["short"], seconds=self.plan.flood_s)
            stop.set()
        return {"idle": idle, "under_flood": loaded, "p99_ratio": round(loaded["p99_ms"] / idle["p99_ms"], 2)}

    def latency(self):
        """One short text per request, one after another: the service (defaults) against the same
        backend in-process on one thread and on every core, taking turns (load.taking_turns). A lone
        text runs on the lone session, which has every core, so the service's overhead is its p50 less
        the every-core in-process p50."""
        from encoder_server.settings import resolve
        texts = corpus.texts("short", self.plan.single_requests * 4)
        engines_by_label = {f"onnx backend in-process, {threads} thread(s)":
                            engines.our_backend(resolve(model=self.model, num_worker=1, threads_per_worker=threads))
                            for threads in dict.fromkeys((1, _cores()))}
        engines_by_label["service (onnx fp32, defaults)"] = self.service("service (onnx fp32, defaults)")
        with contextlib.ExitStack() as stack:
            running = [stack.enter_context(engine) for engine in engines_by_label.values()]
            medians = load.taking_turns(
                running, lambda engine: load.sequential(engine, texts, 1, self.tokens["short"]), self.plan.repeats)
        rows = [{"engine": label, **median} for label, median in zip(engines_by_label, medians)]
        for row in rows:
            _progress(row)
        service, every_core = rows[-1], rows[-2]
        return {"rows": rows, "overhead_p50_ms": round(service["p50_ms"] - every_core["p50_ms"], 2),
                "ratio_to_in_process": round(service["sentences_per_s"] / every_core["sentences_per_s"], 3)}

    def memory(self):
        """Peak memory of the whole server's process group with 1, 2 and 3 lanes of one thread in its
        worker process while it serves a mixed workload, what each extra lane adds, and the default
        server's."""
        texts = corpus.texts("medium", self.plan.texts.get("medium", 32)) + corpus.texts("short", 64)
        if "long" in self.plan.kinds:
            texts += corpus.texts("long", 64)
        rows = []
        configs = [(f"{lanes} lane(s)", ("--lanes", str(lanes), "--threads-per-worker", "1")) for lanes in (1, 2, 3)]
        for name, flags in configs + [("defaults", ())]:
            with self.service(name, *flags) as engine:
                client = engine.client()
                try:
                    for _ in range(self.plan.repeats):
                        client.encode(texts)
                finally:
                    client.close()
                time.sleep(0.5)  # a last sample after the work
            rows.append({"server": name, "peak_rss_mb": engine.peak_rss_mb, "peak_pss_mb": engine.peak_pss_mb})
            _progress(rows[-1])
        units = ("rss", "pss")
        extra = {unit: round((rows[2][f"peak_{unit}_mb"] - rows[0][f"peak_{unit}_mb"]) / 2, 1) for unit in units}
        from encoder_server.model.cpus import default_workers
        big_host = default_workers(64)
        return {"rows": rows, "per_extra_lane_mb": extra,
                "host_64_cores": {"lanes": big_host, **{f"{unit}_mb": round(rows[0][f"peak_{unit}_mb"] + (
                    big_host - 1) * extra[unit]) for unit in extra}}}

    def variants(self):
        """Configurations one flag away from the defaults, one client sending 256 medium texts."""
        texts = corpus.texts("medium", 512)
        configs = [("defaults (onnx fp32, 1 worker of 2 lanes x 1 thread)", ()),
                   ("1 lane x 2 threads", ("--lanes", "1")),
                   ("2 worker processes x 1 thread", ("--num-worker", "2")),
                   ("2 lanes x 2 threads (oversubscribed)", ("--lanes", "2", "--threads-per-worker", "2")),
                   ("torch backend, 2 workers x 1 thread", ("--backend", "torch")),
                   ("int8", ("--quantize", "int8")),
                   ("--max-batch-tokens 8192", ("--max-batch-tokens", "8192")),
                   ("--max-batch-tokens 256", ("--max-batch-tokens", "256")),
                   ("--pooling-layer -3 (layers above are pruned)", ("--pooling-layer", "-3"))]
        rows = []
        for name, flags in configs:
            with self.service(name, *flags) as engine:
                runs = [load.sequential(engine, texts, 256, self.tokens["medium"]) for _ in range(self.plan.repeats)]
                rows.append({"engine": name, "flags": " ".join(flags), **load.median_of(runs)})
                _progress(rows[-1])
            rows[-1]["peak_rss_mb"] = engine.peak_rss_mb
        return rows

    def graphs(self):
        """Every ONNX variant considered (fusions, int8 recipes), in-process on one thread."""
        from transformers import AutoConfig

        from benchmark import graphs
        from encoder_server.model.model_cache import onnx_files
        from encoder_server.model.passes import passes_for
        from encoder_server.model.tokenizer import Tokenizer
        from encoder_server.settings import resolve

        settings = resolve(model=self.model)
        tokenizer = Tokenizer.for_spec(settings)
        passes_by_kind = {}
        for kind in self.plan.kinds:
            encoding = tokenizer.tokenize(corpus.texts(kind, self.plan.texts[kind]))
            passes_by_kind[kind] = [inputs for _, inputs in passes_for(settings, encoding, tokenizer.pad_id)]
        config = AutoConfig.from_pretrained(settings.model)
        return graphs.screen(onnx_files(settings)[0], config, passes_by_kind, self.plan.repeats, settings)

    def accuracy(self):
        """Row cosine and top-10 neighbour overlap of each served configuration, and of
        sentence-transformers' own int8 export when --peer-python has it, against sentence-transformers."""
        import numpy as np
        from sentence_transformers import SentenceTransformer

        from encoder_client import EncoderClient
        from encoder_server.model.quantization_check import neighbour_overlap, row_cosine
        texts = corpus.texts("medium", 256) + corpus.texts("long", 128) + corpus.texts("short", 128)
        reference = SentenceTransformer(str(self.model), device="cpu").encode(texts, batch_size=32)
        embedded = {}
        for name, flags in [("onnx fp32 (default)", ()), ("torch fp32", ("--backend", "torch")),
                            ("onnx int8", ("--quantize", "int8"))]:
            with self.service(name, *flags) as engine:
                with EncoderClient("127.0.0.1", engine.port, engine.port_out, timeout=600) as client:
                    embedded[name] = client.encode(texts)
        try:
            with peers.Peer(self.peer_python, "st-int8", self.model, _peer_workdir(self.model)) as peer:
                embedded[peer.name] = peer.embed(texts)
        except RuntimeError as error:
            print(f"# skipped: {error}", flush=True)
        rows = []
        for name, rows_of_engine in embedded.items():
            cosine = row_cosine(reference, rows_of_engine)
            rows.append({"engine": name, "min_cosine": float(np.min(cosine)), "mean_cosine": float(np.mean(cosine)),
                         "top10_overlap": neighbour_overlap(reference, rows_of_engine), "texts": len(texts)})
            _progress(rows[-1])
        return rows

    def peers(self):
        """Our service (fp32, and int8) against in-process peers run by --peer-python (benchmark/peers.py) on
        the same cells, engines alternated round by round; ratios are taken within a round."""
        from benchmark import peers
        cells = peers.cells(**self.plan.peer_cells)
        tokens = {kind: _mean_tokens(self.model, corpus.texts(kind, 256)) for kind in ("short", "medium", "long")}
        workdir = _peer_workdir(self.model)
        with contextlib.ExitStack() as stack:
            engines = {}
            for server in self.served():
                engine = stack.enter_context(server)
                engines[engine.name] = lambda request, engine=engine: peers.measure(engine, request)
            for name in self.peer_engines:
                try:
                    peer = stack.enter_context(peers.Peer(self.peer_python, name, self.model, workdir))
                except RuntimeError as error:  # a peer whose packages are missing is reported, not fatal
                    print(f"# skipped: {error}", flush=True)
                    continue
                engines[peer.name] = peer.measure
            rows = peers.compare(engines, cells, tokens, self.plan.repeats)
        return {"rows": rows, "summary": peers.summarize(rows, baseline=report.SERVICE),
                "mean_tokens": {kind: round(value, 1) for kind, value in tokens.items()}}

    def pipeline(self):
        """The server's own ceiling: the zero backend, which runs no model (benchmark/pipeline.py),
        taking turns with the bare chain of its processes, which does none of its work
        (benchmark/roofline.py)."""
        from benchmark import roofline
        return roofline.measure(self.plan.window_s, rounds=self.plan.repeats, model=self.model, log_dir=self.log_dir)

    def gpu(self):
        """On a CUDA device: benchmark/gpu_sweep.py at 4 workers and at the default count, fp32 and
        fp16, against sentence-transformers in-process on the same device. Skipped, saying why, where
        torch sees no GPU."""
        import torch
        if not torch.cuda.is_available():
            return {"skipped": "torch sees no CUDA device"}
        from benchmark import gpu_sweep
        texts = (20_000, 4_000) if self.plan.sentence_transformers else (256, 64)
        return gpu_sweep.measure(self.model, sorted({4, gpu_sweep.default_workers()}), self.plan.window_s,
                                 self.plan.repeats, texts, self.log_dir)

    def ceiling(self):
        """This CPU's fp32 and int8 matrix-product throughput on the model's shapes (benchmark/ceiling.py)."""
        from transformers import AutoConfig

        from benchmark import ceiling
        config = AutoConfig.from_pretrained(str(self.model))
        shape = {"hidden": config.hidden_size, "ffn": config.intermediate_size, "layers": config.num_hidden_layers}
        return {"model": shape, **ceiling.measure(shape["hidden"], shape["ffn"])}



def _probe(engine, texts, tokens_per_text, seconds=None):
    """Sequential one-text requests: all of `texts`, or as many as fit in `seconds`."""
    client = engine.client()
    latencies, deadline = [], time.perf_counter() + (seconds or 1e9)
    try:
        client.encode(texts[:1])
        for text in texts * (1 if seconds is None else 1000):
            if time.perf_counter() > deadline:
                break
            sent = time.perf_counter()
            client.encode([text])
            latencies.append(time.perf_counter() - sent)
    finally:
        client.close()
    return load.summary(len(latencies), sum(latencies), latencies, tokens_per_text)


def _flood(engine, texts, stop):
    client = engine.client()
    try:
        while not stop.is_set():
            client.encode(texts)
    except Exception:  # the server is stopped under the flood at the end; nothing to report
        pass
    finally:
        client.close()


def _mean_tokens(model, texts):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    return sum(len(ids) for ids in tokenizer(texts, truncation=True, max_length=256)["input_ids"]) / len(texts)


def _note_rss(rows, engine):
    for row in rows:
        if row["engine"] == engine.name:
            row["peak_rss_mb"] = engine.peak_rss_mb


def _cores():
    return len(os.sched_getaffinity(0))


def _peer_workdir(model):
    """Where the peers keep their exports of `model` between runs."""
    return Path(tempfile.gettempdir()) / "encoder-server-benchmark-peers" / model.name


def _progress(row):
    print(json.dumps(row), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no baselines that take long to load")
    parser.add_argument("--model", default=None, help="model folder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--infinity", default=shutil.which("infinity_emb"),
                        help="infinity_emb executable for the peer baseline (default: found on PATH)")
    parser.add_argument("--out", default=str(HERE / "results"), help="folder for results.json and plots")
    parser.add_argument("--only", nargs="+", default=None,
                        choices=SCENARIOS)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--peer-python", default=sys.executable,
                        help="interpreter of the peers' virtual environment (see benchmark/peers.py)")
    parser.add_argument("--peer-engines", nargs="*", default=["fastembed", "st-onnx", "st-int8"],
                        choices=sorted(peers.ENGINES), help="in-process peers for the peers scenario")
    args = parser.parse_args(argv)

    from encoder_server.model.model_folder import default_model_path
    plan = SMOKE if args.smoke else Plan()
    if args.repeats:
        plan.repeats = args.repeats
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suite = Suite(plan, Path(args.model) if args.model else default_model_path(), args.infinity, out,
                  args.peer_python, args.peer_engines)
    chosen = args.only or [name for name in SCENARIOS if name not in SLOW] + (list(SLOW) if plan.variants else [])
    results = {"machine": _machine(), "smoke": args.smoke,
               "model": suite.model.name if args.model else "all-MiniLM-L6-v2 (bundled)",
               "mean_tokens": {kind: round(tokens, 1) for kind, tokens in suite.tokens.items()},
               "repeats": plan.repeats, "infinity": bool(args.infinity)}
    previous = out / "results.json"
    if args.only and previous.exists():
        earlier = json.loads(previous.read_text())
        earlier.setdefault("measured_on", {name: earlier["machine"]["date"] for name in SCENARIOS if name in earlier})
        results = {**earlier, **results}
    for name in chosen:
        started = time.monotonic()
        results[name] = getattr(suite, name)()
        results.setdefault("measured_on", {})[name] = f"{results['machine']['date']} ({results['machine']['isa']})"
        print(f"# {name} took {time.monotonic() - started:.0f}s", flush=True)
        previous.write_text(json.dumps(results, indent=2))
    default_out = out.resolve() == (HERE / "results").resolve()
    report.write(results, out, HERE / "RESULTS.md" if default_out else out / "RESULTS.md")
    for log in out.glob("bench-*.log"):
        log.unlink()
    return 0


def _machine():
    import onnxruntime
    import torch
    return {"cpu": _cpu_model(), "isa": _cpu_isa(), "cores": _cores(), "gpu": None,
            "python": platform.python_version(), "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "date": time.strftime("%Y-%m-%d")}


def _cpu_flags():
    for line in _cpuinfo():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpu_model():
    for line in _cpuinfo():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpu_isa():
    """The vector extensions that decide fp32 and int8 speed."""
    return " ".join(flag for flag in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")
                    if flag in _cpu_flags()) or "unknown"


def _cpuinfo():
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main())
