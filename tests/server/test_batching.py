"""encoder_server.server.batching (Tokenized, BatchPlanner, Batch.scatter), encoder_server.model.passes and
encoder_server.model.arrays."""
import numpy as np
import pytest

from encoder_server.model.arrays import concat_parts, pad_token_axis, stack_rows
from encoder_server.model.passes import (GPU_PASS_COST_TOKENS, PASS_COST_TOKENS, Encoding, Pass, cut_by_length,
                                         group_sizes, pass_cost_tokens)
from encoder_server.server.batching import BULK, MIN_PADDING, PRIORITY, BatchPlanner, Tokenized
from encoder_server.server.messages import Job

CLS, SEP = 101, 102


def make_job(lengths, priority=False, job_id=1, seq=1, offset=0):
    """Row r has ids [CLS, marker, 5, 5, ..., SEP] with marker = 1000 * job_id + r (lengths >= 3)."""
    ids, pooled = [], []
    for row, length in enumerate(lengths):
        assert length >= 3
        ids.append([CLS, 1000 * job_id + row] + [5] * (length - 3) + [SEP])
        pooled.append([0] + [1] * (length - 2) + [0])
    job = Job(job_id, seq, offset, texts=["x"] * len(lengths), priority=priority)
    return Tokenized(job, Encoding(ids, pooled))


def fake_model(batch):
    """What a model would see: one output per padded row, [marker id, real length]."""
    markers = batch.inputs.input_ids[:, 1].astype(np.float32)
    lengths = batch.inputs.attention_mask.sum(axis=1).astype(np.float32)
    return np.stack([markers, lengths], axis=1)


def all_passes(planner, limit=10000):
    passes = []
    for _ in range(limit):
        batch = planner.next_pass()
        if batch is None:
            return passes
        passes.append(batch)
    raise AssertionError("planner never ran dry")


def row_lengths(batch):
    return [len(job.ids[row]) for job, row in batch.rows]


# ----- budgets and ordering -----

@pytest.mark.parametrize("pass_cost", [PASS_COST_TOKENS, GPU_PASS_COST_TOKENS])
@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_tokens, max_size", [(64, 256), (100, 4), (30, 3), (1000, 7)])
def test_passes_respect_budgets_and_cover_every_row_once(seed, max_tokens, max_size, pass_cost):
    rng = np.random.default_rng(seed)
    jobs = [make_job(list(rng.integers(3, 40, size=rng.integers(1, 20))), priority=bool(rng.integers(2)),
                     job_id=j + 1) for j in range(4)]
    planner = BatchPlanner(max_batch_tokens=max_tokens, max_batch_size=max_size, pass_cost=pass_cost)
    for job in jobs:
        planner.add(job)
    seen = []
    for batch in all_passes(planner):
        lengths = row_lengths(batch)
        n, longest = batch.inputs.input_ids.shape
        assert n == len(batch.rows) >= 1
        assert longest == max(lengths)
        assert n <= max_size
        assert n * longest <= max_tokens or n == 1
        assert lengths == sorted(lengths)
        seen.extend((job.job.job_id, row) for job, row in batch.rows)
    expected = [(job.job.job_id, row) for job in jobs for row in range(len(job.ids))]
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(expected)
    assert not planner


def test_single_overlong_row_goes_alone():
    planner = BatchPlanner(max_batch_tokens=10, max_batch_size=8)
    planner.add(make_job([4, 30, 5]))
    shapes = [b.inputs.input_ids.shape for b in all_passes(planner)]
    assert (1, 30) in shapes
    assert all(n * longest <= 10 or n == 1 for n, longest in shapes)


def test_budget_used_fully_when_rows_equal():
    planner = BatchPlanner(max_batch_tokens=40, max_batch_size=256)
    planner.add(make_job([10] * 9))
    shapes = [b.inputs.input_ids.shape for b in all_passes(planner)]
    assert shapes == [(4, 10), (4, 10), (1, 10)]


def test_max_batch_size_caps_rows():
    planner = BatchPlanner(max_batch_tokens=10 ** 6, max_batch_size=3)
    planner.add(make_job([3] * 7))
    assert [b.inputs.input_ids.shape[0] for b in all_passes(planner)] == [3, 3, 1]


def test_empty_planner():
    planner = BatchPlanner()
    assert not planner
    assert planner.next_pass() is None


# ----- padding -----

def test_padding_uses_pad_id_and_masks_are_right():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=16, pad_id=7)
    job = make_job([6, 3, 4])
    planner.add(job)
    (batch,) = all_passes(planner)
    assert batch.inputs.input_ids.dtype == np.int64
    assert batch.inputs.input_ids.shape == (3, 6)
    for i, (j, row) in enumerate(batch.rows):
        ids, pooled = job.ids[row], job.encoding.pooled[row]
        n = len(ids)
        assert list(batch.inputs.input_ids[i, :n]) == ids
        assert np.all(batch.inputs.input_ids[i, n:] == 7)
        assert list(batch.inputs.attention_mask[i]) == [1] * n + [0] * (6 - n)
        assert list(batch.inputs.pool_mask[i]) == pooled + [0] * (6 - n)
    assert [row for _, row in batch.rows] == [1, 2, 0]     # sorted by length 3, 4, 6


@pytest.mark.parametrize("type_ids", [None, [[0, 0, 0, 1, 1]]])
def test_a_lone_row_is_a_pass_of_its_own_arrays_as_a_padded_pass_would_hold_them(type_ids):
    ids, pooled = [[101, 7592, 2088, 999, 102]], [[0, 1, 1, 1, 0]]
    lone = Pass.pad(ids, pooled, pad_id=9, type_ids=type_ids)
    beside = Pass.pad(ids + [[101, 102]], pooled + [[0, 0]], pad_id=9,
                      type_ids=None if type_ids is None else type_ids + [[0, 0]])
    for name in ("input_ids", "attention_mask", "pool_mask", "token_type_ids"):
        array = getattr(lone, name)
        assert array.dtype == np.int64 and array.shape == (1, 5), name
        assert array.tolist() == getattr(beside, name)[:1].tolist(), name
    assert lone.attention_mask.tolist() == [[1] * 5]
    assert lone.token_type_ids.tolist() == (type_ids or [[0] * 5])


@pytest.mark.parametrize("rows", [1, 3])
def test_without_pooling_masks_every_real_token_counts_as_with_masks_of_ones(rows):
    """An Encoding whose `pooled` is None (every token counts, the usual case) gives the pass that
    masks of ones would, and mixing it with one that has masks keeps each row's own."""
    ids = [[101, 7592, 2088, 999, 102], [101, 7, 102], [101, 8, 9, 102]][:rows]
    ones = [[1] * len(row) for row in ids]
    plain = Pass.of([(Encoding(ids, None), row) for row in range(rows)], pad_id=9)
    masked = Pass.pad(ids, ones, pad_id=9)
    for name in ("input_ids", "attention_mask", "pool_mask", "token_type_ids"):
        assert getattr(plain, name).tolist() == getattr(masked, name).tolist(), name
    assert plain.pool_mask is not plain.attention_mask  # two arrays: a backend may own each
    special = Encoding([[101, 5, 102]], [[0, 1, 0]])
    mixed = Pass.of([(Encoding(ids, None), 0), (special, 0)], pad_id=9)
    assert mixed.pool_mask.tolist() == [[1] * 5, [0, 1, 0, 0, 0]]


# ----- priority -----

def test_priority_rows_come_before_half_consumed_bulk_job():
    planner = BatchPlanner(max_batch_tokens=20, max_batch_size=256)
    bulk = make_job([5] * 12, priority=False, job_id=1)
    planner.add(bulk)
    first = planner.next_pass()
    assert all(job is bulk for job, _ in first.rows)
    consumed = len(first.rows)
    assert 0 < consumed < 12
    urgent = make_job([4, 6], priority=True, job_id=2)
    planner.add(urgent)
    second = planner.next_pass()
    assert [job for job, _ in second.rows] == [urgent, urgent]
    rest = all_passes(planner)
    assert all(job is bulk for batch in rest for job, _ in batch.rows)
    assert sum(len(b.rows) for b in rest) == 12 - consumed


def test_priority_added_after_bulk_goes_first():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=256)
    bulk = make_job([5] * 3, priority=False, job_id=1)
    urgent = make_job([9], priority=True, job_id=2)
    planner.add(bulk)
    planner.add(urgent)
    first = planner.next_pass()
    assert [job for job, _ in first.rows] == [urgent]


def test_several_priority_jobs_share_one_pass():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=256)
    a = make_job([5, 8], priority=True, job_id=1)
    b = make_job([3, 6], priority=True, job_id=2)
    planner.add(a)
    planner.add(b)
    (batch,) = all_passes(planner)
    assert {job.job.job_id for job, _ in batch.rows} == {1, 2}
    assert row_lengths(batch) == [3, 5, 6, 8]
    completed = batch.scatter(fake_model(batch))
    assert set(completed) == {a, b}


def test_small_requests_of_very_different_lengths_take_separate_passes_oldest_first():
    planner = BatchPlanner(max_batch_tokens=1024, max_batch_size=64)
    old_long = make_job([40] * 4, priority=True, job_id=1)
    new_short = make_job([6] * 8, priority=True, job_id=2)
    old_long.arrived, new_short.arrived = 1.0, 2.0
    planner.add(new_short)
    planner.add(old_long)
    first, second = all_passes(planner)
    assert row_lengths(first) == [40] * 4 and row_lengths(second) == [6] * 8  # not 12 rows padded to 40


def test_bulk_jobs_run_in_arrival_order():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=256)
    first, second = make_job([9, 9], job_id=1), make_job([3, 3], job_id=2)
    planner.add(first)
    planner.add(second)
    batches = all_passes(planner)
    assert [[job.job.job_id for job, _ in b.rows] for b in batches] == [[1, 1], [2, 2]]


# ----- merging bulk jobs of different requests -----

def test_bulk_jobs_of_similar_length_share_a_pass():
    planner = BatchPlanner(max_batch_tokens=100, max_batch_size=64)
    a, b = make_job([10, 10, 10], job_id=1, seq=1), make_job([9, 10, 10], job_id=2, seq=2)
    planner.add(a)
    planner.add(b)
    (batch,) = all_passes(planner)
    assert sorted(job.job.job_id for job, _ in batch.rows) == [1, 1, 1, 2, 2, 2]
    assert set(batch.scatter(fake_model(batch))) == {a, b}


def test_short_rows_of_a_later_job_are_never_padded_to_a_long_pass():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=64)
    planner.add(make_job([40], job_id=1))
    planner.add(make_job([4] * 5 + [35], job_id=2))
    first, second = all_passes(planner)
    assert [(job.job.job_id, len(job.ids[row])) for job, row in first.rows] == [(2, 35), (1, 40)]
    assert row_lengths(second) == [4] * 5


def test_top_up_takes_the_longest_rows_that_fit_and_respects_the_budget():
    planner = BatchPlanner(max_batch_tokens=40, max_batch_size=64)
    planner.add(make_job([10], job_id=1))
    planner.add(make_job([8, 9, 9, 10, 10, 30], job_id=2))
    first = all_passes(planner)[0]
    assert row_lengths(first) == [9, 10, 10, 10]     # 4 x 10 tokens: the budget, longest fitting rows first
    assert first.inputs.input_ids.shape == (4, 10)


def test_oldest_bulk_job_anchors_every_pass():
    planner = BatchPlanner(max_batch_tokens=30, max_batch_size=64)
    old = make_job([10] * 6, job_id=1)
    planner.add(old)
    planner.add(make_job([10] * 6, job_id=2))
    batches = all_passes(planner)
    assert all(any(job is old for job, _ in batch.rows) for batch in batches[:2])


@pytest.mark.parametrize("seed", range(6))
def test_bulk_padding_stays_within_a_quarter_of_each_pass(seed):
    rng = np.random.default_rng(seed)
    planner = BatchPlanner(max_batch_tokens=512, max_batch_size=64)
    for job_id in range(1, 5):
        planner.add(make_job(list(rng.integers(3, 120, size=40)), job_id=job_id))
    for batch in all_passes(planner):
        lengths = row_lengths(batch)
        assert lengths[0] >= lengths[-1] - max(lengths[-1] // 4, MIN_PADDING)


def test_each_bulk_pass_starts_from_the_oldest_jobs_longest_row():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=64)
    old = make_job([5, 50, 20], job_id=1)
    planner.add(old)
    planner.add(make_job([60, 48, 19, 6], job_id=2))
    passes = [[(job.job.job_id, len(job.ids[row])) for job, row in batch.rows] for batch in all_passes(planner)]
    # rows at most a quarter shorter join the anchor; a longer row never does
    assert passes == [[(2, 48), (1, 50)], [(2, 19), (1, 20)], [(1, 5)], [(2, 60)], [(2, 6)]]


@pytest.mark.parametrize("priority", [False, True])
def test_on_a_gpu_rows_of_any_length_fill_a_pass_up_to_the_budget_and_the_row_limit(priority):
    """Where a pass costs more than any padding (pass_cost_tokens("cuda")), a job's short texts take
    one pass, and other jobs' rows join it, where the CPU's planner cuts them by length."""
    lengths = [3, 5, 8, 12, 12, 17, 20, 26]

    def passes(device, max_size=64):
        planner = BatchPlanner(max_batch_tokens=16384, max_batch_size=max_size, pass_cost=pass_cost_tokens(device))
        planner.add(make_job(lengths, priority=priority, job_id=1))
        planner.add(make_job([4, 9], priority=priority, job_id=2))
        return [row_lengths(batch) for batch in all_passes(planner)]
    assert passes("cuda") == [sorted(lengths + [4, 9])]
    assert len(passes("cpu")) >= 2
    assert [len(rows) for rows in passes("cuda", max_size=4)] == [4, 4, 2]
    assert pass_cost_tokens("cpu", "zero") == pass_cost_tokens("cuda")  # a stand-in for a fast device
    assert pass_cost_tokens("cpu", "onnx") == pass_cost_tokens("cpu") < pass_cost_tokens("cuda", "torch")


# ----- lanes -----

def test_lanes_keep_priority_and_bulk_rows_apart():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=64)
    planner.add(make_job([5, 5], job_id=1))
    planner.add(make_job([5], priority=True, job_id=2))
    bulk = planner.next_pass(BULK)
    assert [job.job.job_id for job, _ in bulk.rows] == [1, 1]
    assert planner.next_pass(BULK) is None
    assert [job.job.job_id for job, _ in planner.next_pass(PRIORITY).rows] == [2]
    assert planner.next_pass(PRIORITY) is None


def test_priority_rows_wait_for_company_at_most_the_batch_wait():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=4)
    job = make_job([5], priority=True, job_id=1)
    planner.add(job)
    assert planner.ready(PRIORITY, wait_s=0)
    assert not planner.ready(PRIORITY, wait_s=0.01, now=job.arrived + 0.005)
    assert planner.ready(PRIORITY, wait_s=0.01, now=job.arrived + 0.011)
    planner.add(make_job([5, 5, 5], priority=True, job_id=2))     # now a full pass: no more waiting
    assert planner.ready(PRIORITY, wait_s=10, now=job.arrived)


def test_bulk_lane_never_waits_and_empty_lanes_are_not_ready():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=64)
    assert not planner.ready(PRIORITY) and not planner.ready(BULK)
    planner.add(make_job([5], job_id=1))
    assert planner.ready(BULK, wait_s=10) and not planner.ready(PRIORITY)


# ----- scatter / result -----

@pytest.mark.parametrize("seed", range(4))
def test_scatter_restores_original_row_order(seed):
    rng = np.random.default_rng(seed)
    lengths = list(rng.integers(3, 30, size=17))
    job = make_job(lengths, job_id=3)
    planner = BatchPlanner(max_batch_tokens=60, max_batch_size=5)
    planner.add(job)
    completed = []
    for batch in all_passes(planner):
        completed += batch.scatter(fake_model(batch))
    assert completed == [job]
    assert job.done
    result = job.result()
    expected = np.array([[3000 + r, length] for r, length in enumerate(lengths)], dtype=np.float32)
    np.testing.assert_array_equal(result, expected)


def test_scatter_reports_job_done_only_in_its_last_pass():
    planner = BatchPlanner(max_batch_tokens=12, max_batch_size=256)
    job = make_job([4, 4, 4, 4, 4, 4], job_id=1)          # 3 rows per pass
    planner.add(job)
    results = [batch.scatter(fake_model(batch)) for batch in all_passes(planner)]
    assert results == [[], [job]]
    assert not make_job([3]).done


def test_scatter_mixed_priority_jobs_each_get_their_rows():
    planner = BatchPlanner(max_batch_tokens=1000, max_batch_size=256)
    a = make_job([7, 3, 5], priority=True, job_id=1)
    b = make_job([4, 6], priority=True, job_id=2)
    planner.add(a)
    planner.add(b)
    for batch in all_passes(planner):
        batch.scatter(fake_model(batch))
    np.testing.assert_array_equal(a.result(), [[1000, 7], [1001, 3], [1002, 5]])
    np.testing.assert_array_equal(b.result(), [[2000, 4], [2001, 6]])


def test_token_level_outputs_padded_in_result():
    # `none` pooling: each row's output is [seq, dim] with its own pass's seq length
    planner = BatchPlanner(max_batch_tokens=12, max_batch_size=256)
    job = make_job([3, 3, 3, 6], job_id=1)
    planner.add(job)
    for batch in all_passes(planner):
        n, seq = batch.inputs.input_ids.shape
        out = np.ones((n, seq, 2), dtype=np.float32) * batch.inputs.attention_mask[:, :, None]
        batch.scatter(out)
    result = job.result()
    assert result.shape == (4, 6, 2)
    assert np.all(result[:3, :3] == 1) and np.all(result[:3, 3:] == 0)
    assert np.all(result[3] == 1)


# ----- arrays helpers -----

def test_stack_rows_pooled_vectors():
    rows = [np.full(3, i, dtype=np.float32) for i in range(4)]
    out = stack_rows(rows)
    assert out.shape == (4, 3)
    np.testing.assert_array_equal(out[:, 0], [0, 1, 2, 3])


def test_stack_rows_token_level_zero_pads():
    rows = [np.ones((2, 3)), np.full((5, 3), 2.0), np.full((4, 3), 3.0)]
    out = stack_rows(rows)
    assert out.shape == (3, 5, 3)
    expected = np.zeros((3, 5, 3))
    expected[0, :2] = 1
    expected[1, :5] = 2
    expected[2, :4] = 3
    np.testing.assert_array_equal(out, expected)


def test_concat_parts_pooled_in_order():
    parts = [np.full((2, 3), 1.0), np.full((1, 3), 2.0), np.full((3, 3), 3.0)]
    out = concat_parts(parts)
    assert out.shape == (6, 3)
    np.testing.assert_array_equal(out[:, 0], [1, 1, 2, 3, 3, 3])


def test_concat_parts_token_level_zero_pads():
    parts = [np.ones((2, 4, 3)), np.full((1, 7, 3), 2.0)]
    out = concat_parts(parts)
    assert out.shape == (3, 7, 3)
    expected = np.zeros((3, 7, 3))
    expected[:2, :4] = 1
    expected[2] = 2
    np.testing.assert_array_equal(out, expected)


def test_pad_token_axis():
    a = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    padded = pad_token_axis(a, 5, axis=1)
    assert padded.shape == (1, 5, 3)
    assert padded.dtype == np.float32
    np.testing.assert_array_equal(padded[:, :2], a)
    assert np.all(padded[:, 2:] == 0)
    assert pad_token_axis(a, 2, axis=1).shape == (1, 2, 3)
    assert pad_token_axis(a, 1, axis=1).shape == (1, 2, 3)   # never truncates
    b = np.ones((2, 3))
    np.testing.assert_array_equal(pad_token_axis(b, 4, axis=0), np.vstack([b, np.zeros((2, 3))]))


# ----- queue waits, and the length-sorted cut that in-process embedding uses -----

def test_queue_wait_is_the_ventilators_wait_plus_ours_counted_once():
    job = Tokenized(Job(1, 1, 0, ["x"], priority=True, waited_ms=250.0), Encoding([[CLS, 5, SEP]], [[1, 0, 1]]),
                    arrived=10.0)
    planner = BatchPlanner()
    planner.add(job)
    batch = planner.next_pass()
    assert batch.start(now=10.5) == [pytest.approx(0.75)]
    assert batch.start(now=11.0) == []


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_tokens, max_rows", [(64, 256), (100, 4), (30, 3), (1000, 7)])
def test_cut_by_length_covers_every_row_once_within_budgets(seed, max_tokens, max_rows):
    lengths = list(np.random.default_rng(seed).integers(3, 40, size=50))
    groups = cut_by_length(lengths, max_tokens, max_rows)
    assert sorted(i for group in groups for i in group) == list(range(50))
    for group in groups:
        longest = max(lengths[i] for i in group)
        assert len(group) <= max_rows and (len(group) * longest <= max_tokens or len(group) == 1)
    assert [lengths[i] for group in groups for i in group] == sorted(lengths)


def test_group_sizes_take_one_row_even_when_it_alone_is_over_budget():
    assert group_sizes([50, 60], max_tokens=10, max_rows=8) == [1, 1]
    assert group_sizes([3, 3, 3, 4], max_tokens=12, max_rows=8) == [3, 1]
    assert group_sizes([3, 3, 3, 3], max_tokens=100, max_rows=2) == [2, 2]


def test_a_pass_stops_growing_where_padding_costs_more_than_another_pass():
    short, long = 5, 5 + PASS_COST_TOKENS  # padding ten short rows to the long ones: 10 x PASS_COST_TOKENS
    assert group_sizes([short] * 10 + [long] * 10, max_tokens=1024, max_rows=64) == [10, 10]
    assert group_sizes([10, 11, 12, 13], max_tokens=1024, max_rows=64) == [4]  # a token more each: one pass
    lengths = [short, long]  # one row padded by PASS_COST_TOKENS costs no more than a second pass
    assert group_sizes(lengths, max_tokens=1024, max_rows=64) == [2]
