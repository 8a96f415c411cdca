"""How long the bundled model's tokenizer takes a text, in one process, as a worker tokenizes a job:
batches of 32 short, medium and long texts of the corpus, through Tokenizer.tokenize (plain texts
through model/word_pieces.py), once warm (its words seen before, as in a server that has run a
while) and once cold (a fresh tokenizer for each batch: no word has been seen). With other source
trees given, each tree is timed in a process of its own, in alternated rounds, each round in the
other order, so that the host's drift favours none; each other tree's ratio to this one is taken
within each round, and the median of those ratios given.

    python -m benchmark.tokenizer [--rounds 3] [BEFORE_DIR ...]
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from .load import turn_orders

HERE = Path(__file__).resolve().parent
KINDS = ("short", "medium", "long")
KEYS = ("warm_us", "cold_us")
BATCH = 32  # texts per batch, as in a job of a 32-text request

# run in a child with the tree to time first on its path: µs per text, warm and cold, per kind
_TIMING = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
os.environ["HF_HUB_OFFLINE"] = "1"
from benchmark import corpus
from encoder_server.model.model_folder import default_model_path
from encoder_server.model.tokenizer import Tokenizer
path, batches, size, kinds = default_model_path(), int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
tokenizer = Tokenizer(path, 256)
result = {}
for kind in kinds:
    texts = corpus.texts(kind, batches * size)
    runs = [texts[i * size:(i + 1) * size] for i in range(batches)]
    for batch in runs:
        tokenizer.tokenize(batch)  # every word seen once
    warm = float("inf")
    for _ in range(5):  # the quickest of five passes: this host's moments of slowness are not the code's
        started = time.perf_counter()
        for batch in runs:
            tokenizer.tokenize(batch)
        warm = min(warm, time.perf_counter() - started)
    cold, fresh_runs = 0.0, runs[:max(1, batches // 8)]
    for batch in fresh_runs:
        fresh = Tokenizer(path, 256)
        started = time.perf_counter()
        fresh.tokenize(batch)
        cold += time.perf_counter() - started
    result[kind] = {"warm_us": 1e6 * warm / (batches * size), "cold_us": 1e6 * cold / (len(fresh_runs) * size)}
print(json.dumps(result))
"""


def time_tree(tree, batches):
    """{kind: {warm_us, cold_us}} of the source tree at `tree`, timed in a process of its own."""
    done = subprocess.run([sys.executable, "-c", _TIMING, str(tree), str(batches), str(BATCH), json.dumps(KINDS)],
                          capture_output=True, text=True, cwd=tree, check=True)
    return json.loads(done.stdout)


def compare(trees, rounds=3, batches=64):
    """({tree: {kind: {warm_us, cold_us}}}, the medians over `rounds` alternated rounds (a tree named
    twice is timed once a round); {other tree: {kind: {key: the median of its rounds' ratios to the
    first tree}}})."""
    trees = list(dict.fromkeys(trees))
    runs = {tree: [] for tree in trees}
    for turn in turn_orders(trees, rounds):
        for tree in turn:
            runs[tree].append(time_tree(tree, batches))
    medians = {tree: {kind: {key: statistics.median(run[kind][key] for run in results) for key in KEYS}
                      for kind in KINDS} for tree, results in runs.items()}
    first = runs[trees[0]]
    ratios = {tree: {kind: {key: round(statistics.median(other[kind][key] / this[kind][key]
                                                          for this, other in zip(first, runs[tree])), 2)
                            for key in KEYS} for kind in KINDS} for tree in trees[1:]}
    return medians, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", nargs="*", help="other source trees to time beside this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=64, help=f"batches of {BATCH} texts per kind and round")
    args = parser.parse_args(argv)
    trees = [str(HERE.parent), *map(str, map(Path.resolve, map(Path, args.before)))]
    medians, ratios = compare(trees, args.rounds, args.batches)
    print(json.dumps({"us_per_text": medians, "ratio_to_this_tree": ratios}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
