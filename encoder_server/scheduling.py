"""The ventilator's pure logic: split requests into jobs, queue them fairly, hand them to workers.

Small requests go to the priority queue, spread over the workers that are idle. Large ones
become mini-jobs in a per-client round-robin queue, so one client's 100k texts cannot starve
another's 5k. A worker holds at most
`prefetch_size` bulk jobs and at most `max_batch_size` texts of priority jobs, so a priority job
always finds room and runs before anything the worker has buffered.
"""
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass
class Job:
    job_id: int
    seq: int              # the request this job belongs to
    offset: int           # index of the job's first text in the request
    texts: list
    client: bytes = b""   # the fairness key; stays in the ventilator
    priority: bool = False
    is_tokenized: bool = False
    with_tokens: bool = False


def split_request(seq, client, texts, priority_batch_size, max_batch_size, job_ids, priority_pieces=1, **flags):
    """A request as jobs: a small one as up to `priority_pieces` priority jobs of near-equal size,
    a large one as bulk mini-jobs of at most max_batch_size texts."""
    if len(texts) <= priority_batch_size:
        pieces = max(1, min(priority_pieces, len(texts)))
        bounds = [len(texts) * i // pieces for i in range(pieces + 1)]
        return [Job(next(job_ids), seq, start, texts[start:end], client, True, **flags)
                for start, end in zip(bounds, bounds[1:])]
    return [Job(next(job_ids), seq, start, texts[start:start + max_batch_size], client, False, **flags)
            for start in range(0, len(texts), max_batch_size)]


class FairQueue:
    """Round-robin over clients, FIFO within a client."""

    def __init__(self):
        self._by_client = OrderedDict()
        self._size = 0

    def push(self, job):
        self._by_client.setdefault(job.client, deque()).append(job)
        self._size += 1

    def pop(self):
        client, jobs = next(iter(self._by_client.items()))
        job = jobs.popleft()
        del self._by_client[client]
        if jobs:
            self._by_client[client] = jobs  # back of the line
        self._size -= 1
        return job

    @property
    def clients(self):
        return len(self._by_client)

    def __len__(self):
        return self._size


@dataclass
class _WorkerLoad:
    bulk_jobs: int = 0
    priority_texts: int = 0
    texts: int = 0


class Dispatcher:
    def __init__(self, priority_batch_size=16, max_batch_size=256, prefetch_size=2):
        self.priority_batch_size = priority_batch_size
        self.max_batch_size = max_batch_size
        self.prefetch_size = prefetch_size
        self._priority = deque()
        self._bulk = FairQueue()
        self._workers = {}
        self._assigned = {}         # job_id -> (worker, job)
        self._jobs_left = {}        # seq -> jobs not yet done
        self._job_ids = itertools.count(1)

    # ----- requests -----

    def submit(self, seq, client, texts, **flags):
        """Queue a request. A small one is spread over the idle workers, so that on a quiet
        server it runs on every core rather than one."""
        idle = sum(1 for load in self._workers.values() if load.texts == 0)
        jobs = split_request(seq, client, texts, self.priority_batch_size, self.max_batch_size,
                             self._job_ids, priority_pieces=idle, **flags)
        self._jobs_left[seq] = len(jobs)
        for job in jobs:
            (self._priority.append if job.priority else self._bulk.push)(job)

    def job_done(self, job_id):
        """Record a finished job; returns its request's seq when that request is now complete."""
        worker, job = self._assigned.pop(job_id, (None, None))
        if job is None:
            return None
        self._load(worker, job, -1)
        self._jobs_left[job.seq] -= 1
        if self._jobs_left[job.seq] == 0:
            del self._jobs_left[job.seq]
            return job.seq
        return None

    # ----- workers -----

    def add_worker(self, worker):
        self._workers.setdefault(worker, _WorkerLoad())

    def assignments(self):
        """(worker, job) pairs that can be sent now, highest priority first."""
        sent = []
        while self._priority or self._bulk:
            queue_pop, worker = self._next_source()
            if worker is None:
                break
            job = queue_pop()
            self._assigned[job.job_id] = (worker, job)
            self._load(worker, job, +1)
            sent.append((worker, job))
        return sent

    def _next_source(self):
        if self._priority:
            worker = self._least_loaded(lambda load: load.priority_texts + len(self._priority[0].texts)
                                        <= self.max_batch_size)
            if worker is not None:
                return self._priority.popleft, worker
        if self._bulk:
            return self._bulk.pop, self._least_loaded(lambda load: load.bulk_jobs < self.prefetch_size)
        return None, None

    def _least_loaded(self, has_room):
        candidates = [(load.texts, worker) for worker, load in self._workers.items() if has_room(load)]
        return min(candidates)[1] if candidates else None

    def _load(self, worker, job, sign):
        """Add (sign=+1) or remove (sign=-1) a job's weight on a worker."""
        load = self._workers[worker]
        load.texts += sign * len(job.texts)
        if job.priority:
            load.priority_texts += sign * len(job.texts)
        else:
            load.bulk_jobs += sign

    # ----- status -----

    @property
    def in_flight_requests(self):
        return len(self._jobs_left)

    @property
    def workers(self):
        return {worker.decode(errors="replace"): load.texts for worker, load in self._workers.items()}

    def queue_depths(self):
        return {"priority": len(self._priority), "bulk": len(self._bulk), "bulk_clients": self._bulk.clients}
