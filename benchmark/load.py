"""Load patterns: one client working through a list, and N closed-loop clients for a fixed time."""
import statistics
import threading
import time

import numpy as np


def summary(texts_done, seconds, latencies, tokens_per_text):
    latencies_ms = np.array(latencies) * 1000 if latencies else np.array([np.nan])
    rate = texts_done / seconds
    return {"sentences_per_s": round(rate, 1), "tokens_per_s": round(rate * tokens_per_text),
            "p50_ms": round(float(np.percentile(latencies_ms, 50)), 1),
            "p95_ms": round(float(np.percentile(latencies_ms, 95)), 1),
            "p99_ms": round(float(np.percentile(latencies_ms, 99)), 1), "requests": len(latencies)}


def sequential(engine, texts, batch, tokens_per_text):
    """One client sending `texts` in requests of `batch` texts, one after another."""
    client = engine.client()
    try:
        client.encode(texts[:min(batch, 32)])  # warm-up
        latencies = []
        started = time.perf_counter()
        for start in range(0, len(texts), batch):
            sent = time.perf_counter()
            client.encode(texts[start:start + batch])
            latencies.append(time.perf_counter() - sent)
        return summary(len(texts), time.perf_counter() - started, latencies, tokens_per_text)
    finally:
        client.close()


def closed_loop(engine, texts, clients, batch, seconds, tokens_per_text, warmup=None):
    """`clients` users each sending `batch` texts, waiting for the reply, and sending again.

    Requests that finish inside the measured window (after `warmup` seconds: by default 1, or the
    window's length where that is shorter) count; the window's length divides the texts they
    carried, which is the steady-state rate once the pipeline is full.
    """
    warmup = min(1.0, seconds) if warmup is None else warmup
    window = {}
    done, latencies, errors = [0], [], []
    lock = threading.Lock()
    ready = threading.Barrier(clients + 1)

    def user(index):
        client = engine.client()
        try:
            ready.wait()
            offset = index * batch
            while True:
                sent = time.perf_counter()
                if sent >= window["end"]:
                    return
                client.encode([texts[(offset + i) % len(texts)] for i in range(batch)])
                finished = time.perf_counter()
                offset += clients * batch
                if window["start"] <= finished <= window["end"]:
                    with lock:
                        done[0] += batch
                        latencies.append(finished - sent)
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=user, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    now = time.perf_counter()
    window.update(start=now + warmup, end=now + warmup + seconds)
    ready.wait()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]!r}")
    return summary(done[0], seconds, latencies, tokens_per_text)


def median_of(runs):
    """Field-wise median of repeated summaries."""
    return {key: round(statistics.median(run[key] for run in runs), 1) for key in runs[0]}


def taking_turns(engines, run, repeats):
    """`run(engine)` `repeats` times for each engine, the engines taking turns, so that an engine and
    its baseline meet the same moments of the host (this VM's speed drifts by tens of percent within
    minutes, so runs made one engine after another compare moments, not engines). Returns each
    engine's median_of its runs, in the engines' order."""
    runs = [[] for _ in engines]
    for turn in turn_orders(list(zip(engines, runs)), repeats):
        for engine, done in turn:
            done.append(run(engine))
    return [median_of(done) for done in runs]


def turn_orders(engines, rounds):
    """`engines` in the order they run in each of `rounds` rounds: as given, then reversed, and so
    on (A B, B A, A B...), so that a drift of the host's speed over the rounds favours none: where
    every round ran A first, B met the later, faster moments of a host speeding up (two runs of the
    same server, back to back: the second 0.89-1.08x the first, 2026-11-29)."""
    return [engines if number % 2 == 0 else engines[::-1] for number in range(rounds)]
