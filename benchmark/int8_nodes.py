"""Which MatMul nodes cost the most accuracy under int8, and which to keep in fp32.

Ranks each quantizable MatMul (one with a constant weight) by what it costs: everything is
quantized but that one node, and the error it removes (mean 1 - row cosine against fp32, on a
mixed corpus) is its cost. Then, on a held-out corpus, keeps the costliest nodes in fp32 one by
one until the min row cosine and the top-10 neighbour overlap reach their goals on each held-out
slice, and times the result against fp32 on one thread.

    HF_HUB_OFFLINE=1 python -m benchmark.int8_nodes [--fp32 PATH]
    HF_HUB_OFFLINE=1 python -m benchmark.int8_nodes --served   # only the served recipe, on 3 held-out slices
"""
import argparse
import logging
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmark import corpus
from encoder_server.model import onnx_export
from encoder_server.model.embedder import Embedder
from encoder_server.model.quantization_check import neighbour_overlap, row_cosine
from encoder_server.model.smoothing import weight_matmuls
from encoder_server.settings import resolve

MIX = {"short": 128, "medium": 128, "long": 64}
SEEDS = (0, 1, 2)  # corpus seeds: the ranking slice, then the held-out slices
MIN_COSINE, MIN_OVERLAP = 0.99, 0.95


def cached_fp32():
    """The bundled model's fp32 file from the export cache."""
    files = sorted(Path.home().glob(".cache/encoder-server/onnx/model-fp32-*/model.onnx"))
    return next(path for path in files if path.with_name("model.onnx.data").exists())


def quantizable(path):
    """The MatMul nodes whose weight is an initializer, in graph order."""
    import onnx
    return list(weight_matmuls(onnx.load(str(path), load_external_data=False).graph))


def mixed(seed):
    """A mixed-length slice of the benchmark corpus; each seed gives different texts."""
    return [text for kind, count in MIX.items() for text in corpus.texts(kind, count, seed=seed)]


class Bench:
    def __init__(self, fp32_file, folder):
        self.settings = resolve(num_worker=1, threads_per_worker=1)
        self.fp32_file, self.folder, self.built = fp32_file, Path(folder), 0

    def embedder(self, path):
        return Embedder(replace(self.settings, onnx_file=str(path)))

    def build(self, exclude):
        """An int8 file with the served recipe, these nodes kept fp32 (a fresh name: ORT maps the weights)."""
        self.built += 1
        target = self.folder / f"variant-{self.built}.onnx"
        onnx_export.quantize(self.fp32_file, target, self.settings,
                             {**onnx_export.INT8_RECIPE, "exclude": tuple(exclude)})
        return target

    def score(self, exclude, slices):
        """One result per (texts, fp32 rows) slice for the int8 file that keeps `exclude` fp32."""
        path = self.build(exclude)
        engine, results = self.embedder(path), []
        for texts, reference in slices:
            rows = engine.embed_texts(texts)
            cosine = row_cosine(reference, rows)
            results.append({"error": float(1 - cosine.mean()), "min": float(cosine.min()),
                            "mean": float(cosine.mean()), "overlap": neighbour_overlap(reference, rows)})
        del engine
        for file in (path, path.with_name(path.name + ".data")):
            file.unlink()
        return results

    def speed_ratio(self, exclude, repeats=3):
        """int8 over fp32 sentences/s on 256 medium texts, one thread, median of `repeats`."""
        texts = corpus.texts("medium", 256)
        engines = [self.embedder(self.fp32_file), self.embedder(self.build(exclude))]
        seconds = [[], []]
        for _ in range(repeats):
            for engine, times in zip(engines, seconds):
                started = time.perf_counter()
                engine.embed_texts(texts)
                times.append(time.perf_counter() - started)
        return statistics.median(seconds[0]) / statistics.median(seconds[1])


def line(name, result):
    return (f"{name:<55} min {result['min']:.5f}  mean {result['mean']:.5f}  "
            f"overlap {result['overlap']:.3f}  error {result['error']:.2e}")


def rank(bench, nodes, ranking):
    """Nodes, costliest first: the error that keeping each one alone in fp32 removes."""
    (everything,) = bench.score((), [ranking])
    print(line("all quantized", everything), flush=True)
    cost = {}
    for node in nodes:
        (result,) = bench.score([node], [ranking])
        cost[node] = everything["error"] - result["error"]
        print(line(f"all but {node}", result), flush=True)
    ranked = sorted(nodes, key=cost.get, reverse=True)
    print("\nRanking (error removed by keeping the node fp32, share of the all-int8 error):")
    for place, node in enumerate(ranked, 1):
        print(f"{place:>3}. {node:<55} {cost[node]:.2e}  {cost[node] / everything['error']:6.1%}")
    return ranked


def select(bench, ranked, held_out):
    """The shortest head of the ranking whose exclusion meets the goals on every held-out slice."""
    exclude = []
    while True:
        results = bench.score(exclude, held_out)
        for index, result in enumerate(results):
            print(line(f"{'+ ' + exclude[-1] if exclude else 'no exclusions'} [held-out {index + 1}]", result),
                  flush=True)
        if all(r["min"] >= MIN_COSINE and r["overlap"] >= MIN_OVERLAP for r in results) or exclude == ranked:
            return exclude, results
        exclude.append(ranked[len(exclude)])


def served(bench, reference):
    import onnx
    graph = onnx.load(str(bench.fp32_file), load_external_data=False).graph
    exclude = onnx_export.matching_matmuls(graph, onnx_export.INT8_RECIPE["exclude"])
    print(f"served recipe keeps {len(exclude)} MatMuls fp32: {exclude}")
    slices = [(texts, reference.embed_texts(texts)) for texts in map(mixed, (1, 2, 3))]
    for index, result in enumerate(bench.score(exclude, slices)):
        print(line(f"served recipe [held-out {index + 1}]", result), flush=True)
    print(f"speed int8 / fp32 (256 medium, 1 thread, median of 3): {bench.speed_ratio(exclude):.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fp32", type=Path, default=None, help="the fp32 ONNX file (default: the cached one)")
    parser.add_argument("--served", action="store_true",
                        help="only score and time the served recipe (INT8_RECIPE) on three held-out slices")
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # quantize_dynamic's advice to pre-process, once per build
    fp32_file = args.fp32 or cached_fp32()
    nodes = quantizable(fp32_file)
    with tempfile.TemporaryDirectory() as folder:
        bench = Bench(fp32_file, folder)
        reference = bench.embedder(fp32_file)
        if args.served:
            return served(bench, reference)
        ranking, *held_out = [(texts, reference.embed_texts(texts)) for texts in map(mixed, SEEDS)]
        print(f"{len(nodes)} quantizable MatMul nodes in {fp32_file}; ranking on {len(ranking[0])} texts", flush=True)
        ranked = rank(bench, nodes, ranking)
        print(f"\nGreedy on {len(held_out)} held-out slices of {len(ranking[0])} texts "
              f"(goals on each: min >= {MIN_COSINE}, overlap >= {MIN_OVERLAP}):")
        exclude, results = select(bench, ranked, held_out)
        print(f"\nExcluded ({len(exclude)}): {exclude}")
        for index, result in enumerate(results):
            print(line(f"final recipe [held-out {index + 1}]", result))
        print(f"speed int8 / fp32 (256 medium, 1 thread, median of 3): {bench.speed_ratio(exclude):.2f}x")


if __name__ == "__main__":
    main()
