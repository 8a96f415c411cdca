"""bert-as-service's published client (bert-serving-client==1.10.0), unmodified, against our server."""
import numpy as np
import pytest
from bert_serving.client import BertClient

from conftest import random_texts

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def bert_client(tiny_server):
    client = BertClient("127.0.0.1", tiny_server.port, tiny_server.port_out, check_version=False, timeout=60000)
    yield client
    client.close()


def test_encode_matches_our_client(bert_client, tiny_server):
    texts = random_texts(70, seed=20)
    with tiny_server.client() as ours:
        expected = ours.encode(texts)
    np.testing.assert_allclose(bert_client.encode(texts), expected, atol=1e-6)


def test_tokenized_input_and_show_tokens(bert_client):
    vectors, tokens = bert_client.encode([["the", "cat"], ["dog", "runs"]], is_tokenized=True, show_tokens=True)
    assert vectors.shape == (2, 32)
    assert tokens[0] == ["[CLS]", "the", "cat", "[SEP]"]


def test_non_blocking_fetch_all_and_encode_async(bert_client, tiny_server):
    batches = [random_texts(n, seed=n) for n in (3, 20, 1, 50)]
    with tiny_server.client() as ours:
        expected = [ours.encode(batch) for batch in batches]
    for batch in batches:
        bert_client.encode(batch, blocking=False)
    fetched = bert_client.fetch_all(sort=True, concat=True)
    np.testing.assert_allclose(fetched, np.concatenate(expected), atol=1e-6)
    results = sorted(bert_client.encode_async(iter(batches), max_num_batch=4, delay=0.5), key=lambda r: r.id)
    assert len(results) == 4
    for result, want in zip(results, expected):
        np.testing.assert_allclose(result.embedding, want, atol=1e-6)


def test_server_config_and_status(bert_client):
    assert bert_client.server_config["max_seq_len"] == 64
    assert bert_client.server_config["show_tokens_to_client"] is True
    assert bert_client.server_status["workers_alive"] == 2
