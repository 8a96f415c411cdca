"""Server configurations against one another on the zero backend, in alternated rounds of
benchmark/pipeline.py's two cells: each round runs every configuration once (the order reversed
every other round, so that a steady drift of the host's speed cancels), and prints, per cell, the
first configuration's rate, each other's and its ratio to the first, and the CPU per request of all
stages together; at the end, each configuration's ratios and their median.

    PYTHONPATH=. python benchmark/results/issue31-pipeline/ab-flags.py ROUNDS SECONDS 'NAME|FLAGS|ENV' ...

FLAGS are server flags (space-separated), ENV comma-separated VAR=VALUE pairs that the server
inherits (a temporary switch in the code under test reads them), e.g.
`'default||' 'one-worker|--num-worker 1|'`.
"""
import os
import statistics
import sys

from benchmark import pipeline

RATES = (("32 clients x 32 short texts", "texts_per_s"), ("32 clients x 1 short text", "requests_per_s"))


def configurations(specs):
    for spec in specs:
        name, flags, env = (spec.split("|") + ["", ""])[:3]
        yield name, flags.split(), dict(pair.split("=", 1) for pair in env.split(",") if pair)


def measure(flags, env, seconds):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return {row["cell"]: row for row in pipeline.measure(flags=flags, seconds=seconds, repeats=1)}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main(rounds, seconds, specs):
    configs = list(configurations(specs))
    base = configs[0][0]
    ratios = {}
    for number in range(rounds):
        order = configs if number % 2 == 0 else configs[::-1]
        rows = {name: measure(flags, env, seconds) for name, flags, env in order}
        for cell, rate in RATES:
            line = [number, cell, base, round(rows[base][cell][rate])]
            for name, _, _ in configs[1:]:
                ratio = rows[name][cell][rate] / rows[base][cell][rate]
                ratios.setdefault((name, cell), []).append(round(ratio, 2))
                line += [name, round(rows[name][cell][rate]), round(ratio, 2)]
            cpu = {name: round(sum(rows[name][cell]["cpu_us_per_request"].values())) for name in rows}
            print(*line, "cpu µs/request", cpu, flush=True)
    for (name, cell), values in ratios.items():
        print(name, "/", base, cell, values, "median", statistics.median(values), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:])
