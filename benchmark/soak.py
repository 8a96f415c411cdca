"""Soak: many clients, tens of thousands of mixed-size requests, workers killed along the way.

Every row of every reply is checked against the embedding of its text, so a lost, duplicated or
misplaced row fails the run. Resident memory of each server process is compared between the
end of warm-up and the end of the run.

    python -m benchmark.soak [--model DIR] [--clients 16] [--requests 20000] [--kills 2]
"""
import argparse
import json
import os
import signal
import threading
import time

import numpy as np
import psutil

from encoder_client import EncoderClient

from .corpus import texts
from .engines import Service

WARM_UP_SHARE = 0.1


def request_sizes(count, seed):
    """Mostly small requests, some medium, a few large."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(3, size=count, p=[0.7, 0.25, 0.05])
    return [int(rng.integers(*{0: (1, 5), 1: (5, 65), 2: (65, 301)}[kind])) for kind in kinds]


def rss_by_process(root_pid):
    """{pid: MB} for the server's supervisor and every child."""
    root = psutil.Process(root_pid)
    return {process.pid: process.memory_info().rss / 2**20 for process in [root, *root.children(recursive=True)]}


class Soak:
    def __init__(self, service, pool, clients, requests, kills, seed=0):
        self.service, self.pool = service, pool
        self.clients, self.requests, self.kills = clients, requests, kills
        self.seed = seed
        self.done = 0
        self.rows = 0
        self.failures = []
        self.lock = threading.Lock()

    def run(self):
        with self._client() as client:
            self.reference = client.encode(self.pool)
        self.threads = threads = [threading.Thread(target=self._client_loop, args=(index,))
                                  for index in range(self.clients)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        warm = self._wait_for_progress(WARM_UP_SHARE)
        rss_warm = rss_by_process(self.service.process.pid)
        killed = []
        for kill in range(self.kills):
            self._wait_for_progress((kill + 1) / (self.kills + 1))
            killed.append(self._kill_a_worker())
        for thread in threads:
            thread.join()
        seconds = time.monotonic() - started
        time.sleep(1.0)
        rss_end = rss_by_process(self.service.process.pid)
        with self._client() as client:
            status = client.server_status
        survivors = sorted(set(rss_warm) & set(rss_end))
        return {
            "clients": self.clients, "requests": self.done, "rows": self.rows, "seconds": round(seconds, 1),
            "requests_per_s": round(self.done / seconds, 1), "failures": self.failures[:5],
            "failed_requests": len(self.failures), "workers_killed": killed, "warm_after_requests": warm,
            "worker_restarts": status["worker_restarts"], "jobs_redispatched": status["jobs_redispatched"],
            "rss_growth_mb": {pid: round(rss_end[pid] - rss_warm[pid], 1) for pid in survivors},
            "max_rss_growth_mb": round(max(rss_end[pid] - rss_warm[pid] for pid in survivors), 1),
            "status_ready_after": status["ready"],
        }

    def _client(self):
        return EncoderClient("127.0.0.1", self.service.port, self.service.port_out, timeout=120)

    def _client_loop(self, index):
        rng = np.random.default_rng(self.seed + index)
        sizes = request_sizes(self.requests // self.clients, self.seed + index)
        with self._client() as client:
            for size in sizes:
                picks = rng.integers(0, len(self.pool), size=size)
                try:
                    result = client.encode([self.pool[i] for i in picks])
                    ok = result.shape == (size, self.reference.shape[1]) and np.allclose(
                        result, self.reference[picks], rtol=1e-4, atol=1e-5)
                    problem = None if ok else f"rows differ from their texts' embeddings (size {size})"
                except Exception as error:  # noqa: BLE001 - every failure is counted and reported
                    problem = f"{type(error).__name__}: {error}"
                with self.lock:
                    self.done += 1
                    self.rows += size
                    if problem:
                        self.failures.append(problem)

    def _wait_for_progress(self, share):
        while self.done < share * self.requests and any(thread.is_alive() for thread in self.threads):
            time.sleep(0.05)
        return self.done

    def _kill_a_worker(self):
        with self._client() as client:
            names = list(client.server_status["worker_busy_texts"])
        pid = int(names[0].rsplit(":", 1)[1])
        os.kill(pid, signal.SIGKILL)
        return pid


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the bundled one)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--flags", nargs=argparse.REMAINDER, default=[], help="more encoder-server start flags")
    args = parser.parse_args(argv)
    pool = texts("medium", 2000)
    with Service("soak", args.flags, args.model) as service:
        report = Soak(service, pool, args.clients, args.requests, args.kills).run()
    print(json.dumps(report, indent=2))
    return 0 if not report["failed_requests"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
