"""encoder_client.rerank: argument checks and the order of results."""
import numpy as np
import pytest

from encoder_client.rerank import check_rerank, ranked


def test_results_come_best_first_with_ties_in_input_order_and_top_n_cuts_them():
    scores = np.array([0.2, 0.9, 0.2, 0.5], dtype=np.float32)
    assert ranked(scores) == [(1, pytest.approx(0.9)), (3, 0.5), (0, pytest.approx(0.2)), (2, pytest.approx(0.2))]
    assert [index for index, _ in ranked(scores, top_n=2)] == [1, 3]
    assert ranked(scores, top_n=1, documents=["a", "b", "c", "d"]) == [(1, pytest.approx(0.9), "b")]
    assert all(isinstance(score, float) for _, score in ranked(scores))


@pytest.mark.parametrize("query, documents, top_n, error", [
    (b"q", ["d"], None, TypeError), ("q", "d", None, TypeError), ("q", [], None, ValueError),
    ("q", ["d"], 0, ValueError), ("q", ["d"], True, ValueError), ("q", ["d"], 1.5, ValueError)])
def test_bad_arguments_are_named(query, documents, top_n, error):
    with pytest.raises(error):
        check_rerank(query, documents, top_n)
