"""encoder_server.server.scheduling: request splitting, the fair queue, and the dispatcher."""
import itertools

import pytest

from encoder_server.server.messages import Job
from encoder_server.server.scheduling import (MAX_LANES, MAX_TOKENIZER_THREADS, Dispatcher, FairQueue, held_per_lane,
                                             split_request)

NOW = 100.0  # the ventilator's monotonic clock, for the tests that do not look at time


def texts(n, prefix="t"):
    return [f"{prefix}{i}" for i in range(n)]


# ----- split_request -----

@pytest.mark.parametrize("n", [1, 5, 16])
def test_small_request_is_one_priority_job(n):
    jobs = split_request(7, texts(n), priority_batch_size=16, max_batch_size=4,
                         job_ids=itertools.count(1))
    assert len(jobs) == 1
    job = jobs[0]
    assert job.priority is True
    assert job.offset == 0 and job.seq == 7
    assert job.texts == texts(n)


@pytest.mark.parametrize("n, size", [(17, 4), (100, 7), (64, 16), (33, 32), (1000, 256)])
def test_large_request_is_split_into_bulk_jobs_covering_every_text_once(n, size):
    request = texts(n)
    jobs = split_request(3, request, priority_batch_size=16, max_batch_size=size,
                         job_ids=itertools.count(1))
    assert len(jobs) == -(-n // size)
    assert all(not job.priority for job in jobs)
    assert all(1 <= len(job.texts) <= size for job in jobs)
    covered = []
    for job in jobs:
        assert job.texts == request[job.offset:job.offset + len(job.texts)]
        covered.extend(range(job.offset, job.offset + len(job.texts)))
    assert sorted(covered) == list(range(n))
    assert len(covered) == n


@pytest.mark.parametrize("n, pieces", [(1, 2), (2, 2), (5, 2), (16, 3), (7, 0)])
def test_small_request_spread_over_pieces_covers_every_text_once(n, pieces):
    request = texts(n)
    jobs = split_request(4, request, priority_batch_size=16, max_batch_size=4,
                         job_ids=itertools.count(1), priority_pieces=pieces)
    assert len(jobs) == max(1, min(pieces, n))
    assert all(job.priority and job.texts for job in jobs)
    assert [text for job in jobs for text in job.texts] == request
    assert [job.offset for job in jobs] == [sum(len(j.texts) for j in jobs[:i]) for i in range(len(jobs))]
    assert max(len(job.texts) for job in jobs) - min(len(job.texts) for job in jobs) <= 1


def test_small_request_runs_on_every_idle_worker():
    d = Dispatcher(priority_batch_size=8, max_batch_size=16, prefetch_size=1)
    for worker in (b"w1", b"w2"):
        d.add_worker(worker)
    d.submit(1, b"A", texts(6), NOW)
    sent = d.assignments(NOW)
    assert sorted(worker for worker, _ in sent) == [b"w1", b"w2"]
    assert [len(job.texts) for _, job in sent] == [3, 3]
    d.submit(2, b"B", texts(6), NOW)                # no idle worker left: one piece
    assert len(d.assignments(NOW)) == 1


def test_a_job_counts_as_dropped_only_when_the_worker_holding_it_says_so():
    """A worker given up, whose job went to another, or a peer on the worker port may name a job it
    does not hold: that ends nothing."""
    d = Dispatcher(priority_batch_size=8, max_batch_size=16, prefetch_size=1)
    for worker in (b"w1", b"w2"):
        d.add_worker(worker)
    d.submit(1, b"A", texts(1), NOW)
    ((holder, job),) = d.assignments(NOW)
    other = b"w2" if holder == b"w1" else b"w1"
    assert d.job_dropped(job.job_id, other) is None and d.worker_of(job.job_id) == holder
    assert d.job_dropped(job.job_id, holder) == job and d.worker_of(job.job_id) is None
    assert d.job_dropped(job.job_id, holder) is None  # reported twice: once is enough


def test_split_request_uses_fresh_job_ids_and_flags():
    ids = itertools.count(10)
    jobs = split_request(1, texts(9), 2, 4, ids, is_tokenized=True, with_tokens=True)
    more = split_request(2, texts(1), 2, 4, ids)
    all_ids = [job.job_id for job in jobs + more]
    assert len(set(all_ids)) == len(all_ids) == 4
    assert all(job.is_tokenized and job.with_tokens for job in jobs)
    assert not more[0].is_tokenized and not more[0].with_tokens


# ----- FairQueue -----

def job(job_id):
    return Job(job_id, seq=0, offset=0, texts=["x"])


def test_fair_queue_round_robin_and_fifo():
    queue = FairQueue()
    for i in range(4):
        queue.push(b"A", job(i))
    for i in range(10, 12):
        queue.push(b"B", job(i))
    queue.push(b"C", job(20))
    assert len(queue) == 7 and queue.clients == 3
    order = [queue.pop() for _ in range(7)]
    assert [j.job_id for j in order] == [0, 10, 20, 1, 11, 2, 3]  # A, B, C, A, B, A, A
    assert len(queue) == 0 and queue.clients == 0
    assert not queue


def test_fair_queue_client_that_returns_goes_to_the_back():
    queue = FairQueue()
    queue.push(b"A", job(1))
    queue.push(b"B", job(2))
    assert queue.pop().job_id == 1           # A now has nothing queued
    queue.push(b"A", job(3))                 # A comes back behind B
    assert [queue.pop().job_id for _ in range(2)] == [2, 3]


# ----- Dispatcher -----

def drain_one_at_a_time(dispatcher, limit=1000):
    """Take assignments and mark them done one by one; the order jobs were sent."""
    order = []
    for _ in range(limit):
        sent = dispatcher.assignments(NOW)
        if not sent:
            break
        for _, j in sent:
            order.append(j)
            dispatcher.job_done(j.job_id)
    return order


def test_priority_jobs_dispatched_before_bulk():
    d = Dispatcher(priority_batch_size=4, max_batch_size=8, prefetch_size=2)
    d.submit(1, b"A", texts(40), NOW)             # bulk, submitted first
    d.submit(2, b"B", texts(3), NOW)              # priority
    d.add_worker(b"w1")
    sent = d.assignments(NOW)
    assert sent[0][1].priority and sent[0][1].seq == 2
    assert [j.priority for _, j in sent] == [True, False, False]


def test_worker_holds_at_most_prefetch_size_bulk_jobs():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=3)
    d.submit(1, b"A", texts(40), NOW)             # 10 bulk jobs
    d.add_worker(b"w1")
    first = d.assignments(NOW)
    assert len(first) == 3
    assert d.assignments(NOW) == []
    d.job_done(first[0][1].job_id)
    again = d.assignments(NOW)
    assert len(again) == 1
    assert again[0][1].offset == 12          # FIFO within the client
    assert d.assignments(NOW) == []


def test_a_worker_on_a_fast_device_holds_a_third_bulk_job_per_lane_unless_the_server_says_otherwise():
    def held(prefetch_size, fast, lanes=1):
        d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=prefetch_size)
        d.submit(1, b"A", texts(400), NOW)
        d.add_worker(b"w1", lanes=lanes, fast=fast)
        return len(d.assignments(NOW))
    assert [held(None, False), held(None, True), held(None, True, lanes=2)] == [2, 3, 6]
    assert [held(1, True), held(4, False)] == [1, 4]
    assert held_per_lane(None, True) == held_per_lane(None, False) + 1


def test_bulk_spread_over_workers_by_load():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=2)
    d.add_worker(b"w1")
    d.add_worker(b"w2")
    d.submit(1, b"A", texts(40), NOW)
    sent = d.assignments(NOW)
    assert len(sent) == 4
    workers = [w for w, _ in sent]
    assert workers.count(b"w1") == 2 and workers.count(b"w2") == 2
    assert d.workers == {"w1": 8, "w2": 8}


def test_priority_job_still_dispatched_when_bulk_slots_full():
    d = Dispatcher(priority_batch_size=4, max_batch_size=8, prefetch_size=1)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(40), NOW)
    assert len(d.assignments(NOW)) == 1
    assert d.assignments(NOW) == []             # bulk slot full
    d.submit(2, b"B", texts(2), NOW)
    sent = d.assignments(NOW)
    assert len(sent) == 1
    worker, j = sent[0]
    assert worker == b"w1" and j.priority and j.seq == 2


def test_priority_texts_per_worker_capped_by_max_batch_size():
    d = Dispatcher(priority_batch_size=4, max_batch_size=8, prefetch_size=1)
    d.add_worker(b"w1")
    for seq in (1, 2, 3):
        d.submit(seq, b"A", texts(4), NOW)
    sent = d.assignments(NOW)
    assert [j.seq for _, j in sent] == [1, 2]
    assert d.queue_depths()["priority"] == 1
    d.job_done(sent[0][1].job_id)
    assert [j.seq for _, j in d.assignments(NOW)] == [3]


def test_nothing_assigned_without_workers():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.submit(1, b"A", texts(1), NOW)
    d.submit(2, b"A", texts(20), NOW)
    assert d.assignments(NOW) == []
    assert d.queue_depths() == {"priority": 1, "bulk": 5, "bulk_clients": 1}


def test_fairness_between_clients():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.submit(1, b"A", texts(80, "a"), NOW)        # 20 bulk jobs
    d.submit(2, b"B", texts(8, "b"), NOW)         # 2 bulk jobs
    d.add_worker(b"w1")
    order = drain_one_at_a_time(d)
    assert len(order) == 22
    b_turns = [turn for turn, j in enumerate(order) if j.seq == 2]
    assert len(b_turns) == 2
    assert max(b_turns) < 4, b_turns         # not after all of A's 20 jobs
    assert [j.offset for j in order if j.seq == 1] == list(range(0, 80, 4))
    assert [j.offset for j in order if j.seq == 2] == [0, 4]


def test_fairness_when_late_client_arrives_mid_stream():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(80), NOW)
    order = []
    for _ in range(3):                       # A runs alone for a while
        (_, j), = d.assignments(NOW)
        order.append(j)
        d.job_done(j.job_id)
    d.submit(2, b"B", texts(8), NOW)
    order += drain_one_at_a_time(d)
    b_turns = [turn for turn, j in enumerate(order) if j.seq == 2]
    assert b_turns and b_turns[0] <= 4 and b_turns[-1] <= 6, b_turns


def test_job_done_returns_seq_only_when_request_complete():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=5)
    d.add_worker(b"w1")
    d.submit(9, b"A", texts(12), NOW)             # 3 bulk jobs
    sent = d.assignments(NOW)
    assert len(sent) == 3
    ids = [j.job_id for _, j in sent]
    assert d.job_done(ids[2]) is None
    assert d.job_done(ids[0]) is None
    assert d.in_flight_requests == 1
    assert d.job_done(ids[1]).seq == 9
    assert d.in_flight_requests == 0


def test_job_done_twice_is_ignored():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=5)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(8), NOW)
    (_, j1), (_, j2) = d.assignments(NOW)
    assert d.job_done(j1.job_id) is None
    assert d.job_done(j1.job_id) is None     # a repeated DONE must not count twice
    assert d.in_flight_requests == 1
    assert d.job_done(j2.job_id).seq == 1


def test_in_flight_and_queue_depths():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    assert d.in_flight_requests == 0
    assert d.queue_depths() == {"priority": 0, "bulk": 0, "bulk_clients": 0}
    d.submit(1, b"A", texts(2), NOW)
    d.submit(2, b"A", texts(10), NOW)             # 3 bulk jobs
    d.submit(3, b"B", texts(5), NOW)              # 2 bulk jobs
    assert d.in_flight_requests == 3
    assert d.queue_depths() == {"priority": 1, "bulk": 5, "bulk_clients": 2}
    d.add_worker(b"w1")
    sent = d.assignments(NOW)
    assert [j.priority for _, j in sent] == [True, False]
    assert d.queue_depths() == {"priority": 0, "bulk": 4, "bulk_clients": 2}
    assert d.workers == {"w1": 2 + 4}
    assert d.job_done(sent[0][1].job_id).seq == 1
    assert d.in_flight_requests == 2
    assert d.workers == {"w1": 4}
    order = drain_one_at_a_time(d)
    d.job_done(sent[1][1].job_id)
    order = order + drain_one_at_a_time(d)
    assert d.in_flight_requests == 0
    assert d.queue_depths() == {"priority": 0, "bulk": 0, "bulk_clients": 0}
    assert d.workers == {"w1": 0}


def test_unknown_job_id_ignored():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(1), NOW)
    sent = d.assignments(NOW)
    assert d.job_done(12345) is None
    assert d.in_flight_requests == 1
    assert d.workers == {"w1": 1}
    assert d.job_done(sent[0][1].job_id).seq == 1


def test_a_worker_with_lanes_holds_that_many_times_the_bulk_jobs_and_priority_texts():
    d = Dispatcher(priority_batch_size=4, max_batch_size=4, prefetch_size=2)
    d.add_worker(b"w1", lanes=3)
    d.submit(1, b"A", texts(100), NOW)       # 25 bulk jobs of 4
    assert len(d.assignments(NOW)) == 6      # prefetch_size x lanes
    for seq in range(2, 6):
        d.submit(seq, b"B", texts(4), NOW)   # priority jobs of 4 texts: room for 3 x 4 texts
    assert [job.seq for _, job in d.assignments(NOW)] == [2, 3, 4]


def test_each_thread_a_worker_tokenizes_on_beyond_the_first_holds_one_more_bulk_job():
    d = Dispatcher(priority_batch_size=4, max_batch_size=4, prefetch_size=2)
    d.add_worker(b"w1", lanes=1, tokenizers=4)
    d.add_worker(b"greedy", lanes=1, tokenizers=10**9)
    d.submit(1, b"A", texts(4 * 200), NOW)
    sent = d.assignments(NOW)
    held = [job for worker, job in sent if worker == b"w1"]
    assert len(held) == 2 + 3                                       # prefetch_size x lanes, + tokenizers - 1
    assert len(sent) - len(held) == 2 + MAX_TOKENIZER_THREADS - 1   # a worker cannot claim the whole queue
    d.job_done(held[0].job_id)
    assert [worker for worker, _ in d.assignments(NOW)] == [b"w1"]


def test_a_worker_cannot_claim_more_lanes_than_the_limit():
    d = Dispatcher(priority_batch_size=4, max_batch_size=4, prefetch_size=1)
    d.add_worker(b"greedy", lanes=10**9)
    d.add_worker(b"none", lanes=0)            # still gets work: at least one lane
    d.submit(1, b"A", texts(4 * (MAX_LANES + 10)), NOW)
    sent = [worker for worker, _ in d.assignments(NOW)]
    assert sent.count(b"greedy") == MAX_LANES and sent.count(b"none") == 1


def test_add_worker_twice_keeps_its_load():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(20), NOW)
    assert len(d.assignments(NOW)) == 1
    d.add_worker(b"w1")                      # a repeated READY
    assert d.assignments(NOW) == []
    assert d.workers == {"w1": 4}


# ----- failures, cancellation, deadlines -----

def _dispatcher_with_two_workers():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=2)
    d.add_worker(b"w1")
    d.add_worker(b"w2")
    return d


def test_dead_workers_jobs_go_to_the_front_and_run_alone():
    d = _dispatcher_with_two_workers()
    d.submit(1, b"A", texts(16), NOW)
    sent = d.assignments(NOW)
    lost = [job for worker, job in sent if worker == b"w1"]
    requeued, poisoned = d.remove_worker(b"w1")
    assert requeued == lost and poisoned == []
    assert d.assignments(NOW) == []  # w2 is busy, and a suspect runs only on an idle worker
    for worker, job in sent:
        if worker == b"w2":
            d.job_done(job.job_id)
    again = d.assignments(NOW)
    assert [job for _, job in again] == [lost[0]]  # alone: nothing else joins it
    assert d.workers == {"w2": len(lost[0].texts)}


def test_a_job_on_two_dead_workers_is_reported_as_poison():
    d = _dispatcher_with_two_workers()
    d.submit(1, b"A", texts(2), NOW)
    (worker, job), *_ = d.assignments(NOW)
    d.remove_worker(worker)
    d.add_worker(b"w3")
    (second_worker, same), *_ = [(w, j) for w, j in d.assignments(NOW) if j.job_id == job.job_id]
    requeued, poisoned = d.remove_worker(second_worker)
    assert [j.job_id for j in poisoned] == [job.job_id] and requeued == []


def test_a_clients_requests_and_a_jobs_worker_are_found():
    d = _dispatcher_with_two_workers()
    d.submit(1, b"A", texts(2), NOW, req_id=10)
    d.submit(2, b"B", texts(2), NOW, req_id=10)
    d.submit(3, b"A", texts(2), NOW, req_id=11)
    assert sorted(d.requests_of(b"A")) == [1, 3] and d.requests_of(b"C") == []
    sent = d.assignments(NOW)
    assert all(d.worker_of(job.job_id) == worker for worker, job in sent)
    d.job_done(sent[0][1].job_id)
    assert d.worker_of(sent[0][1].job_id) is None
    d.cancel(1)
    d.cancel(3)
    assert d.requests_of(b"A") == [] and d.requests_of(b"B") == [2]


def test_a_worker_that_only_lost_touch_does_not_make_its_jobs_poison():
    d = _dispatcher_with_two_workers()
    d.submit(1, b"A", texts(2), NOW)
    (worker, job), *_ = d.assignments(NOW)
    for _ in range(3):
        d.remove_worker(worker, crashed=False)  # it connected again: same process, same name
        d.add_worker(worker)
        (worker, again), *_ = [(w, j) for w, j in d.assignments(NOW) if j.job_id == job.job_id]
    requeued, poisoned = d.remove_worker(worker)
    assert poisoned == [] and [j.job_id for j in requeued] == [job.job_id]


def test_cancel_drops_queued_jobs_and_frees_the_pending_texts():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(12), NOW)
    (_, sent), = d.assignments(NOW)
    assert d.pending_texts == 12
    assert d.cancel(1) == 8  # two jobs never sent
    assert d.pending_texts == 0 and d.in_flight_requests == 0 and len(d.queue_depths()) == 3
    assert d.job_done(sent.job_id) is None  # the sent one finishes unnoticed
    assert d.workers == {"w1": 0} and d.cancel(1) is None


def test_expired_requests_are_reported_once():
    d = Dispatcher()
    d.submit(1, b"A", texts(3), 0.0, timeout=100.0)
    d.submit(2, b"A", texts(3), 0.0, timeout=200.0)
    d.submit(3, b"A", texts(3), 0.0)
    assert d.expired(now=150.0) == [1]
    assert d.expired(now=150.0) == []
    d.cancel(2)
    assert d.expired(now=250.0) == []


def test_jobs_leave_with_their_remaining_budget_and_wait_as_durations():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(8), 10.0, timeout=5.0)
    d.submit(2, b"B", texts(1), 10.0)
    (_, patient), (_, timed) = sorted(d.assignments(12.5), key=lambda sent: sent[1].seq, reverse=True)
    assert timed.budget_ms == pytest.approx(2500) and timed.waited_ms == pytest.approx(2500)
    assert patient.budget_ms is None and patient.waited_ms == pytest.approx(2500)
    d.job_done(timed.job_id)
    (_, late), = d.assignments(16.0)        # sent after its request's deadline: nothing left
    assert late.seq == 1 and late.budget_ms == 0 and late.waited_ms == pytest.approx(6000)


def test_a_requeued_job_is_stamped_afresh():
    d = Dispatcher(priority_batch_size=2, max_batch_size=4, prefetch_size=1)
    d.add_worker(b"w1")
    d.submit(1, b"A", texts(3), 0.0, timeout=10.0)
    (_, first), = d.assignments(1.0)
    d.remove_worker(b"w1")
    d.add_worker(b"w2")
    (_, again), = d.assignments(4.0)
    assert again.job_id == first.job_id
    assert (first.budget_ms, again.budget_ms) == (pytest.approx(9000), pytest.approx(6000))


# ----- several models -----

def test_a_job_goes_only_to_a_worker_of_its_requests_model():
    dispatcher = Dispatcher(priority_batch_size=4, max_batch_size=8, prefetch_size=1)
    dispatcher.add_worker(b"embed-worker", model=0)
    dispatcher.add_worker(b"rerank-worker", model=1)
    dispatcher.submit(1, b"c", texts(2), NOW, model=1)
    dispatcher.submit(2, b"c", texts(40), NOW, model=1)
    dispatcher.submit(3, b"c", texts(2), NOW, model=0)
    sent = dispatcher.assignments(NOW)
    by_worker = {}
    for worker, job in sent:
        by_worker.setdefault(worker, set()).add(job.seq)
    assert by_worker == {b"rerank-worker": {1, 2}, b"embed-worker": {3}}


def test_a_flood_on_one_model_leaves_another_models_requests_first_in_line():
    dispatcher = Dispatcher(priority_batch_size=4, max_batch_size=8, prefetch_size=1)
    dispatcher.add_worker(b"a", model=0)
    dispatcher.add_worker(b"b", model=1)
    for seq in range(1, 50):  # model 0's worker is full and its queue long
        dispatcher.submit(seq, b"flood", texts(64), NOW, model=0)
    dispatcher.assignments(NOW)
    assert dispatcher.queue_depths(0)["bulk"] > 0
    dispatcher.submit(100, b"other", texts(1), NOW, model=1)
    assert [(worker, job.seq) for worker, job in dispatcher.assignments(NOW)] == [(b"b", 100)]
    assert dispatcher.queue_depths(1) == {"priority": 0, "bulk": 0, "bulk_clients": 0}
    assert set(dispatcher.workers_of(1)) == {"b"}


def test_a_model_without_workers_keeps_its_jobs_queued_and_cancel_finds_them():
    dispatcher = Dispatcher(priority_batch_size=4, max_batch_size=8, prefetch_size=1)
    dispatcher.add_worker(b"a", model=0)
    dispatcher.submit(1, b"c", texts(20), NOW, model=1)
    assert dispatcher.assignments(NOW) == []
    assert dispatcher.cancel(1) == 20 and dispatcher.queue_depths(1)["bulk"] == 0
