"""encoder_server.server.assembly.Assembler: putting a request's parts back together."""
import time

import numpy as np
import pytest

from encoder_server.server.assembly import Assembler
from encoder_server.server.messages import Registration


def part(offset, n, dim=3):
    """Rows offset..offset+n-1, each filled with its own index in the request."""
    return np.repeat(np.arange(offset, offset + n, dtype=np.float32)[:, None], dim, axis=1)


def tokens_for(offset, n):
    return [["[CLS]", f"w{i}", "[SEP]"] for i in range(offset, offset + n)]


def expected_rows(total, dim=3):
    return part(0, total, dim)


def test_single_part_after_registration():
    assembler = Assembler()
    assert assembler.register(1, Registration(b"client", 42, rows=4)) is None
    done = assembler.add_part(1, 0, part(0, 4))
    assert done is not None
    assert done.identity == b"client" and done.req_id == 42
    np.testing.assert_array_equal(done.array, expected_rows(4))
    assert done.tokens is None
    assert len(assembler) == 0


def test_parts_in_order():
    assembler = Assembler()
    assembler.register(1, Registration(b"c", 1, rows=10))
    assert assembler.add_part(1, 0, part(0, 4)) is None
    assert assembler.add_part(1, 4, part(4, 4)) is None
    done = assembler.add_part(1, 8, part(8, 2))
    np.testing.assert_array_equal(done.array, expected_rows(10))


@pytest.mark.parametrize("order", [[2, 0, 1], [1, 2, 0], [2, 1, 0]])
def test_parts_out_of_order(order):
    offsets = [(0, 4), (4, 4), (8, 2)]
    assembler = Assembler()
    assembler.register(5, Registration(b"c", 9, rows=10))
    results = [assembler.add_part(5, *offsets[i][:1], part(*offsets[i])) for i in order]
    assert results[:-1] == [None, None]
    np.testing.assert_array_equal(results[-1].array, expected_rows(10))
    assert len(assembler) == 0


def test_parts_before_registration():
    assembler = Assembler()
    assert assembler.add_part(3, 4, part(4, 2)) is None
    assert assembler.add_part(3, 0, part(0, 4)) is None
    assert len(assembler) == 1
    done = assembler.register(3, Registration(b"late", 7, rows=6))
    assert done is not None and done.identity == b"late" and done.req_id == 7
    np.testing.assert_array_equal(done.array, expected_rows(6))
    assert len(assembler) == 0


def test_some_parts_before_registration_rest_after():
    assembler = Assembler()
    assert assembler.add_part(3, 2, part(2, 2)) is None
    assert assembler.register(3, Registration(b"c", 7, rows=4)) is None
    done = assembler.add_part(3, 0, part(0, 2))
    np.testing.assert_array_equal(done.array, expected_rows(4))


def test_duplicate_part_ignored():
    assembler = Assembler()
    assembler.register(1, Registration(b"c", 1, rows=6))
    assert assembler.add_part(1, 0, part(0, 3)) is None
    assert assembler.add_part(1, 0, part(0, 3)) is None     # a re-sent job: must not complete the request
    assert len(assembler) == 1
    done = assembler.add_part(1, 3, part(3, 3))
    assert done.array.shape == (6, 3)
    np.testing.assert_array_equal(done.array, expected_rows(6))


def test_duplicate_part_before_registration_ignored():
    assembler = Assembler()
    assembler.add_part(1, 0, part(0, 2))
    assembler.add_part(1, 0, part(0, 2))
    assert assembler.register(1, Registration(b"c", 1, rows=4)) is None
    done = assembler.add_part(1, 2, part(2, 2))
    np.testing.assert_array_equal(done.array, expected_rows(4))


def test_tokens_concatenated_in_order():
    assembler = Assembler()
    assembler.register(1, Registration(b"c", 1, rows=5, with_tokens=True))
    assembler.add_part(1, 3, part(3, 2), tokens_for(3, 2))
    done = assembler.add_part(1, 0, part(0, 3), tokens_for(0, 3))
    assert done.tokens == tokens_for(0, 5)
    np.testing.assert_array_equal(done.array, expected_rows(5))


def test_tokens_dropped_when_not_asked_for():
    assembler = Assembler()
    assembler.register(1, Registration(b"c", 1, rows=2, with_tokens=False))
    done = assembler.add_part(1, 0, part(0, 2), tokens_for(0, 2))
    assert done.tokens is None


def test_token_level_parts_zero_padded():
    assembler = Assembler()
    assembler.register(1, Registration(b"c", 1, rows=3))
    a = np.ones((2, 4, 5), dtype=np.float32)
    b = np.full((1, 6, 5), 2.0, dtype=np.float32)
    assembler.add_part(1, 2, b)
    done = assembler.add_part(1, 0, a)
    expected = np.zeros((3, 6, 5), dtype=np.float32)
    expected[:2, :4] = 1
    expected[2] = 2
    assert done.array.shape == (3, 6, 5)
    np.testing.assert_array_equal(done.array, expected)


def test_requests_kept_apart_and_forgotten_when_complete():
    assembler = Assembler()
    assembler.register(1, Registration(b"a", 1, rows=2))
    assembler.register(2, Registration(b"b", 1, rows=2))
    assert len(assembler) == 2
    assembler.add_part(2, 0, part(10, 1))
    assembler.add_part(1, 0, part(20, 1))
    done_b = assembler.add_part(2, 1, part(11, 1))
    assert done_b.identity == b"b"
    np.testing.assert_array_equal(done_b.array[:, 0], [10, 11])
    assert len(assembler) == 1
    done_a = assembler.add_part(1, 1, part(21, 1))
    assert done_a.identity == b"a"
    np.testing.assert_array_equal(done_a.array[:, 0], [20, 21])
    assert len(assembler) == 0


def test_parts_of_a_finished_or_forgotten_request_are_ignored():
    assembler = Assembler()
    assert assembler.register(1, Registration(b"c", 5, rows=1)) is None
    assert assembler.add_part(1, 0, np.ones((1, 2), np.float32)) is not None
    assert assembler.add_part(1, 0, np.ones((1, 2), np.float32)) is None  # a re-sent job's duplicate
    assembler.register(2, Registration(b"c", 6, rows=2))
    assert assembler.forget(2).req_id == 6
    assert assembler.add_part(2, 0, np.ones((2, 2), np.float32)) is None
    assert len(assembler) == 0


def test_requests_nobody_listens_for_are_given_up_after_the_grace():
    assembler = Assembler()
    assembler.register(1, Registration(b"gone", 1, rows=2))
    assembler.register(2, Registration(b"here", 2, rows=2))
    listening = lambda identity: identity == b"here"  # noqa: E731
    start = time.monotonic()
    assert assembler.abandoned(listening, grace=10, now=start + 5) == []
    assert assembler.abandoned(listening, grace=10, now=start + 11) == [1]
    assert len(assembler) == 1


def test_a_part_of_another_models_width_is_refused_once_the_request_is_registered():
    from encoder_server.server.assembly import PartError

    assembler = Assembler()
    assembler.register(3, Registration(b"c", 1, rows=4, width=1))  # a reranker's: one score per row
    with pytest.raises(PartError, match="8 values per row does not fit request 3, whose model gives 1"):
        assembler.add_part(3, 0, np.zeros((2, 8), dtype=np.float32))
    assert assembler.add_part(3, 0, np.ones((4, 1), dtype=np.float32)).array.shape == (4, 1)


def test_a_sparse_request_takes_sparse_parts_only_and_joins_them_in_order():
    from encoder_client.sparse import SparseVectors
    from encoder_server.server.assembly import PartError

    assembler = Assembler()
    assembler.register(4, Registration(b"c", 1, rows=3, width=5, sparse=True))
    with pytest.raises(PartError, match="ndarray does not fit request 4, whose model gives sparse rows"):
        assembler.add_part(4, 0, np.zeros((1, 5), dtype=np.float32))
    later = SparseVectors.from_dense(np.array([[0, 0, 3, 0, 4]], dtype=np.float32))
    first = SparseVectors.from_dense(np.array([[1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=np.float32))
    assert assembler.add_part(4, 2, later) is None
    done = assembler.add_part(4, 0, first)
    np.testing.assert_array_equal(done.array.to_dense(), np.vstack([first.to_dense(), later.to_dense()]))


def test_a_registration_with_an_output_finishes_the_rows_and_says_the_windows():
    assembler = Assembler()
    output = {"windows": [1, 2], "weights": [4, 10, 30], "dimensions": 2, "normalize": True, "precision": "float16",
              "ranges": None}
    assembler.register(5, Registration(b"c", 1, rows=3, width=3, output=output))
    rows = np.array([[1, 0, 0], [0, 1, 0], [0, 3, 1]], dtype=np.float32)
    done = assembler.add_part(5, 0, rows)
    assert done.windows == [1, 2] and done.array.dtype == np.float16
    merged = (rows[1] * 10 + rows[2] * 30) / 40
    np.testing.assert_allclose(done.array, [[1, 0], merged[:2] / np.linalg.norm(merged[:2])], atol=1e-3)
