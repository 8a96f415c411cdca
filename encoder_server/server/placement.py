"""Which CPUs each of the server's processes runs on, with --pin-cpus (off by default). Pure.

A process of the server does its own work one Python thread at a time (the GIL): the ventilator's
loop, the sink's, and a worker's intake, tokenizing and lanes between the model's calls; beside it
ZeroMQ's I/O thread carries each message. Every message wakes two or three of these threads, which
the OS may wake across CPUs; kept on one CPU, a process's threads take their turns there. What that
is worth is not settled: on 2 cores of a Firecracker VM (AMD EPYC, 2026-12-08, 22 alternated
rounds on the zero backend, benchmark/pipeline.py) pinned servers served 32 clients' 32-text
requests at 0.53-1.61x the rate of the same server unpinned (median 1.07x, 15 rounds of 22 faster)
and their one-text requests at 0.44-1.41x (median 1.00x), the worst rounds together, as if one
vCPU had slowed and the pinned processes could not leave it; serving the bundled model, the medians
of six rounds put throughput and batch-1 latency within 5% either way. Hosts whose CPUs are the server's alone,
a GPU host's among them, are where it may pay; `benchmark/gpu_session.sh` measures it there.

The ventilator and the sink get one CPU each, and each worker its share of the CPUs, or as many as
its own threads compute on where that is more (on the CPU, its lanes' intra-op threads; on a fast
device, its tokenizing threads), laid out in turn over the CPUs the server may use and around again
where there are fewer. Where the turn starts follows the server's port, so that several servers on
one host do not all put their ventilators on the same CPU.
"""
import itertools

from ..model.passes import on_a_fast_device


def layout(cpus, workers, offset=0):
    """{process name: frozenset of CPUs} for the ventilator, the sink and each of `workers` (its name
    -> how many CPUs it takes), over the CPUs `cpus`, the turn starting at `offset`. Empty with fewer
    than two CPUs: there is nothing to keep apart."""
    order = sorted(cpus)
    if len(order) < 2:
        return {}
    start = offset % len(order)
    turns = itertools.cycle(order[start:] + order[:start])
    placed = {"ventilator": frozenset([next(turns)]), "sink": frozenset([next(turns)])}
    for name, count in workers.items():
        placed[name] = frozenset(next(turns) for _ in range(min(max(1, count), len(order))))
    return placed


def cpus_taken(settings, workers, cpus):
    """How many CPUs a worker of `settings` takes, as one of `workers` workers on `cpus` CPUs."""
    if on_a_fast_device(settings.device, settings.backend):
        threads = settings.tokenizer_threads
    else:
        threads = settings.lanes * settings.threads_per_worker
    return min(cpus, max(cpus // workers, threads))


def describe(placed):
    """The layout in words, for the log."""
    return ", ".join(f"{name} on {','.join(map(str, sorted(cpus)))}" for name, cpus in placed.items())
