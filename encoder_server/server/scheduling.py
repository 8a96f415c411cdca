"""The ventilator's pure logic: split requests into jobs, queue them fairly, hand them to workers.

Each served model has its own queues and its own workers, and a job only ever goes to a worker of
its request's model, so a flood on one model never delays another's. Within a model, small requests
go to the priority queue, spread over the workers that are idle. Large ones become mini-jobs in a
per-client round-robin queue, so one client's 100k texts cannot starve another's 5k. A worker holds
at most `prefetch_size` bulk jobs per lane (the forward passes it runs at once; by default as many
as its device needs, see held_per_lane), plus one for each thread it tokenizes on beyond the first,
and at most `max_batch_size` texts of priority jobs per lane, so a priority job always finds room
and runs before anything the worker has buffered.

When a worker dies, its unfinished jobs go back to the front of their queue as suspects. A suspect
runs alone on an idle worker, so a second death pins it down: its request is failed (poisoned input)
rather than crashing workers forever.
"""
import heapq
import itertools
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass

from .messages import Job

MAX_ATTEMPTS = 2  # a job whose worker died this many times fails its request
MAX_LANES = 64    # the most lanes a worker's READY may claim
MAX_TOKENIZER_THREADS = 64  # and the most threads tokenizing ahead of them
HELD_PER_LANE = 2       # bulk jobs a lane holds by default: the one it runs, and one tokenized ahead
HELD_PER_FAST_LANE = 3  # and on a fast device (a GPU, the zero backend): one more, in transit


def held_per_lane(prefetch_size, fast):
    """Bulk jobs a worker holds per lane: `prefetch_size` where the server was given one, else by
    its device. A worker's room for its next job opens only once its finished part has reached the
    sink, the sink's word the ventilator, and the next job the worker: three hops (two take about
    230 µs on an idle 2-core host, `python -m benchmark.hops`; longer under load). A CPU's 64-text
    pass takes tens of ms, so two jobs hide that trip; a pass on a GPU, or on the zero backend,
    takes about as long as the trip, and with two the worker waits for its next job (zero backend,
    2 cores, 32 clients sending 32 short texts: 1.07x the texts/s with three, the median of ten
    alternated rounds, 0.99-1.29x each; one-text requests, which go on the priority queue,
    unchanged). Holding more costs fairness: a job dealt to a worker waits there, whichever client
    sends next."""
    return prefetch_size or (HELD_PER_FAST_LANE if fast else HELD_PER_LANE)


def split_request(seq, texts, priority_batch_size, max_batch_size, job_ids, priority_pieces=1, **flags):
    """A request as jobs: a small one as up to `priority_pieces` priority jobs of near-equal size,
    a large one as bulk mini-jobs of at most max_batch_size texts."""
    if len(texts) <= priority_batch_size:
        pieces = max(1, min(priority_pieces, len(texts)))
        bounds = [len(texts) * i // pieces for i in range(pieces + 1)]
        return [Job(next(job_ids), seq, start, texts[start:end], priority=True, **flags)
                for start, end in zip(bounds, bounds[1:])]
    return [Job(next(job_ids), seq, start, texts[start:start + max_batch_size], **flags)
            for start in range(0, len(texts), max_batch_size)]


class FairQueue:
    """Round-robin over clients, FIFO within a client."""

    def __init__(self):
        self._by_client = OrderedDict()
        self._size = 0

    def push(self, client, job, front=False):
        jobs = self._by_client.setdefault(client, deque())
        if front:
            jobs.appendleft(job)
            self._by_client.move_to_end(client, last=False)
        else:
            jobs.append(job)
        self._size += 1

    def peek(self):
        return next(iter(self._by_client.values()))[0]

    def remove(self, client, seq):
        """Take out every queued job of request `seq`; returns them."""
        jobs = self._by_client.get(client, ())
        removed = [job for job in jobs if job.seq == seq]
        if removed:
            kept = deque(job for job in jobs if job.seq != seq)
            if kept:
                self._by_client[client] = kept
            else:
                del self._by_client[client]
            self._size -= len(removed)
        return removed

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
    suspects: int = 0
    encoded: int = 0  # texts it has finished
    lanes: int = 1    # forward passes it runs at once
    tokenizers: int = 1  # threads it tokenizes jobs on, ahead of its lanes
    model: int = 0    # the index of the model it serves
    fast: bool = False  # whether its passes are short (model/passes.on_a_fast_device)


@dataclass
class Admitted:
    """A request in flight; times are the ventilator's monotonic clock."""
    seq: int
    client: bytes
    texts: int
    jobs_left: int
    admitted: float
    deadline: float = None  # when its client stops waiting
    req_id: int = None      # the client's own number for it
    model: int = 0          # the index of the model it asks for


class Dispatcher:
    def __init__(self, priority_batch_size=16, max_batch_size=256, prefetch_size=None, first_job_id=1):
        """`prefetch_size`: bulk jobs each worker holds per lane (None: by its device, held_per_lane)."""
        self.priority_batch_size = priority_batch_size
        self.max_batch_size = max_batch_size
        self.prefetch_size = prefetch_size
        self._priority = {}         # model -> deque of priority jobs
        self._bulk = {}             # model -> FairQueue of bulk jobs
        self._workers = {}
        self._assigned = {}         # job_id -> (worker, job)
        self._requests = {}         # seq -> Admitted, for requests in flight
        self._by_client_id = {}     # (client, req_id) -> seq, for requests in flight
        self._of_client = {}        # client -> seqs of its requests in flight
        self._deadlines = []        # heap of (deadline, seq)
        self._deaths = Counter()    # job_id -> workers that died holding it
        self._job_ids = itertools.count(first_job_id)
        self.pending_texts = 0      # texts of the requests in flight
        self.texts_encoded = 0
        self.texts_encoded_by_model = Counter()

    # ----- requests -----

    def submit(self, seq, client, texts, now, timeout=None, req_id=None, model=0, **flags):
        """Queue a request for `model` (an index) admitted at `now`, whose client waits `timeout`
        seconds (None: for ever). A small one is spread over the model's idle worker processes, so
        that where each has a core or a few (torch, or --num-worker) it runs on all of them; a
        worker of several lanes has every core for a pass that runs alone."""
        if req_id is not None and self.is_in_flight(client, req_id):
            raise ValueError(f"request {req_id} of {client!r} is already in flight")
        idle = sum(1 for load in self._workers.values() if load.texts == 0 and load.model == model)
        jobs = split_request(seq, texts, self.priority_batch_size, self.max_batch_size,
                             self._job_ids, priority_pieces=idle, **flags)
        deadline = None if timeout is None else now + timeout
        self._requests[seq] = Admitted(seq, client, len(texts), len(jobs), now, deadline, req_id, model)
        if req_id is not None:
            self._by_client_id[client, req_id] = seq
        self._of_client.setdefault(client, set()).add(seq)
        self.pending_texts += len(texts)
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, seq))
        for job in jobs:
            self._enqueue(job)

    def job_done(self, job_id):
        """Record a finished job; returns its request (Admitted) when that request is now complete."""
        worker, job = self._assigned.pop(job_id, (None, None))
        if job is None:
            return None
        self._load(worker, job, -1)
        self._deaths.pop(job_id, None)
        self._workers[worker].encoded += len(job.texts)
        self.texts_encoded += len(job.texts)
        self.texts_encoded_by_model[self._workers[worker].model] += len(job.texts)
        request = self._requests.get(job.seq)
        if request is None:
            return None  # cancelled meanwhile
        request.jobs_left -= 1
        if request.jobs_left:
            return None
        self._forget(job.seq)
        return request

    def job_dropped(self, job_id, worker):
        """`worker` skipped or refused a job; returns the job, or None when that worker does not hold
        it: finished, its request ended, or another's (a worker given up, whose jobs went to others,
        or a peer on the worker port may name one)."""
        holder, job = self._assigned.get(job_id, (None, None))
        if holder != worker:
            return None
        del self._assigned[job_id]
        self._load(worker, job, -1)
        self._deaths.pop(job_id, None)
        return job

    def cancel(self, seq):
        """Drop a request: its queued jobs are never sent, jobs already sent finish unnoticed.
        Returns how many of its texts were never sent, or None when it was not in flight."""
        request = self._requests.get(seq)
        if request is None:
            return None
        self._forget(seq)
        priority, bulk = self._queues(request.model)
        dropped = [job for job in priority if job.seq == seq] + bulk.remove(request.client, seq)
        if any(job.priority for job in dropped):
            self._priority[request.model] = deque(job for job in priority if job.seq != seq)
        for job in dropped:
            self._deaths.pop(job.job_id, None)
        return sum(len(job.texts) for job in dropped)

    def expired(self, now):
        """Seqs of requests in flight whose deadline is before `now`, each reported once."""
        seqs = []
        while self._deadlines and self._deadlines[0][0] < now:
            seq = heapq.heappop(self._deadlines)[1]
            if seq in self._requests:
                seqs.append(seq)
        if len(self._deadlines) > 2 * len(self._requests) + 64:  # finished requests' entries
            self._deadlines = [entry for entry in self._deadlines if entry[1] in self._requests]
            heapq.heapify(self._deadlines)
        return seqs

    def is_in_flight(self, client, req_id):
        """Whether `client` has a request numbered `req_id` in flight."""
        return (client, req_id) in self._by_client_id

    def requests_in_flight(self):
        return list(self._requests.values())

    def requests_of(self, client):
        """Seqs of `client`'s requests in flight."""
        return sorted(self._of_client.get(client, ()))

    def worker_of(self, job_id):
        """The worker job `job_id` was sent to and is not finished on, or None."""
        return self._assigned.get(job_id, (None,))[0]

    def _forget(self, seq):
        request = self._requests.pop(seq)
        self._by_client_id.pop((request.client, request.req_id), None)
        seqs = self._of_client[request.client]
        seqs.discard(seq)
        if not seqs:
            del self._of_client[request.client]
        self.pending_texts -= request.texts

    def _queues(self, model):
        """(priority deque, bulk FairQueue) of a model, made on first use."""
        if model not in self._priority:
            self._priority[model], self._bulk[model] = deque(), FairQueue()
        return self._priority[model], self._bulk[model]

    def _enqueue(self, job, front=False):
        request = self._requests[job.seq]
        priority, bulk = self._queues(request.model)
        if job.priority:
            (priority.appendleft if front else priority.append)(job)
        else:
            bulk.push(request.client, job, front)

    def release_assigned(self):
        """Count every job sent to a worker as finished. For when the sink died: the parts it held
        will never be confirmed, and a worker must not stay full of jobs nobody waits for."""
        for worker, job in self._assigned.values():
            if worker in self._workers:
                self._load(worker, job, -1)
        self._assigned.clear()
        self._deaths.clear()

    # ----- workers -----

    def add_worker(self, worker, lanes=1, model=0, tokenizers=1, fast=False):
        """A worker of `model` (an index); `lanes` and `tokenizers` as it says, within 1..MAX_LANES and
        1..MAX_TOKENIZER_THREADS: a worker cannot claim the whole queue; `fast` as it says of its device."""
        load = self._workers.setdefault(worker, _WorkerLoad(model=model))
        load.lanes, load.model, load.fast = min(max(1, lanes), MAX_LANES), model, fast
        load.tokenizers = min(max(1, tokenizers), MAX_TOKENIZER_THREADS)

    def remove_worker(self, worker, crashed=True):
        """Forget a dead worker and queue its unfinished jobs again, at the front. Returns
        (jobs queued again, jobs that have now been on MAX_ATTEMPTS crashed workers): the caller
        fails the latter's requests. `crashed`: False when the worker only lost touch."""
        if self._workers.pop(worker, None) is None:
            return [], []
        lost = [job for owner, job in self._assigned.values() if owner == worker]
        requeued, poisoned = [], []
        for job in reversed(lost):  # each goes to the front, so the oldest ends up first
            del self._assigned[job.job_id]
            if job.seq not in self._requests:
                self._deaths.pop(job.job_id, None)
                continue
            self._deaths[job.job_id] += crashed
            if self._deaths[job.job_id] >= MAX_ATTEMPTS:
                self._deaths.pop(job.job_id)
                poisoned.insert(0, job)
            else:
                requeued.insert(0, job)
                self._enqueue(job, front=True)
        return requeued, poisoned

    def assignments(self, now):
        """(worker, job) pairs that can be sent at `now`, highest priority first, each job
        stamped with its request's remaining budget and the time it has waited."""
        sent = []
        for model in self._priority:
            while self._priority[model] or self._bulk[model]:
                queue_pop, worker = self._next_source(model)
                if worker is None:
                    break
                job = queue_pop()
                self._assigned[job.job_id] = (worker, job)
                self._load(worker, job, +1)
                sent.append((worker, self._stamped(job, now)))
        return sent

    def _stamped(self, job, now):
        request = self._requests[job.seq]
        budget = None if request.deadline is None else max(0.0, (request.deadline - now) * 1000)
        return job.stamped(budget, max(0.0, (now - request.admitted) * 1000))

    def _next_source(self, model):
        priority, bulk = self._priority[model], self._bulk[model]
        if priority:
            job = priority[0]
            worker = self._worker_for(job, model, lambda load: load.priority_texts + len(job.texts)
                                      <= self.max_batch_size * load.lanes)
            if worker is not None:
                return priority.popleft, worker
        if bulk:
            return bulk.pop, self._worker_for(bulk.peek(), model, self._has_bulk_room)
        return None, None

    def _has_bulk_room(self, load):
        """held_per_lane bulk jobs per lane keep its lanes fed; each thread tokenizing beyond the first
        needs one more to work on."""
        return load.bulk_jobs < held_per_lane(self.prefetch_size, load.fast) * load.lanes + load.tokenizers - 1

    def _worker_for(self, job, model, has_room):
        """A worker of `model`: a suspect job runs alone on an idle one; other jobs avoid one holding a
        suspect."""
        if self._deaths[job.job_id]:
            return self._least_loaded(model, lambda load: load.texts == 0)
        return self._least_loaded(model, lambda load: not load.suspects and has_room(load))

    def _least_loaded(self, model, has_room):
        candidates = [(load.texts, worker) for worker, load in self._workers.items()
                      if load.model == model and has_room(load)]
        return min(candidates)[1] if candidates else None

    def _load(self, worker, job, sign):
        """Add (sign=+1) or remove (sign=-1) a job's weight on a worker."""
        load = self._workers[worker]
        load.texts += sign * len(job.texts)
        load.suspects += sign * bool(self._deaths[job.job_id])
        if job.priority:
            load.priority_texts += sign * len(job.texts)
        else:
            load.bulk_jobs += sign

    # ----- status -----

    @property
    def in_flight_requests(self):
        return len(self._requests)

    @property
    def workers(self):
        return {worker.decode(errors="replace"): load.texts for worker, load in self._workers.items()}

    @property
    def worker_texts_encoded(self):
        return {worker.decode(errors="replace"): load.encoded for worker, load in self._workers.items()}

    def queue_depths(self, model=None):
        """Queued jobs, of one model or of all."""
        models = self._priority if model is None else [model] if model in self._priority else []
        return {"priority": sum(len(self._priority[m]) for m in models),
                "bulk": sum(len(self._bulk[m]) for m in models),
                "bulk_clients": sum(self._bulk[m].clients for m in models)}

    def workers_of(self, model):
        """{worker name: texts it holds} of a model's workers."""
        return {worker.decode(errors="replace"): load.texts for worker, load in self._workers.items()
                if load.model == model}
