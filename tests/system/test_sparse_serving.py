"""A SPLADE model served: the ZeroMQ clients and TEI's /embed_sparse against sentence-transformers'
SparseEncoder.encode, beside a dense model in the same server (sparse_server)."""
import httpx
import numpy as np
import pytest

from conftest import random_texts
from encoder_client import AsyncEncoderClient, ServerError, SparseVectors
from encoder_client.protocol import CHUNK_BYTES

TEXTS = random_texts(40, seed=61) + ["Ünïcödé ✓ and the cat", " ".join(random_texts(20, seed=62))]


@pytest.fixture(scope="module")
def reference(tiny_sparse_encoder):
    from sentence_transformers import SparseEncoder
    return SparseEncoder(str(tiny_sparse_encoder), device="cpu")


def st_rows(reference, texts, top_k=None):
    return reference.encode(texts, convert_to_tensor=True, max_active_dims=top_k).to_dense().numpy()


@pytest.fixture(scope="module")
def client(sparse_server):
    with sparse_server.client() as client:
        yield client


def assert_same_sparse(vectors, expected):
    assert isinstance(vectors, SparseVectors) and vectors.shape == expected.shape
    dense = vectors.to_dense()
    np.testing.assert_array_equal(dense != 0, expected != 0)
    np.testing.assert_allclose(dense, expected, rtol=1e-4, atol=1e-5)  # near 0, log1p(relu) keeps float32's 1e-6
    assert 0 < vectors.nnz < expected.size  # real zeros, and real entries


def test_the_sparse_model_serves_what_sparse_encoder_computes(client, reference):
    assert_same_sparse(client.encode(TEXTS), st_rows(reference, TEXTS))  # 42 texts: jobs of 16 over a worker


def test_top_k_is_sentence_transformers_max_active_dims(client, reference):
    vectors = client.encode(TEXTS, top_k=5)
    assert_same_sparse(vectors, st_rows(reference, TEXTS, top_k=5))
    assert max(np.diff(vectors.offsets)) == 5


def test_tokens_are_each_rows_vocabulary_entries(client, reference):
    vectors, tokens = client.encode(TEXTS[:3], show_tokens=True, top_k=8)
    for i in range(3):
        assert tokens[i] == reference.tokenizer.convert_ids_to_tokens(vectors.row(i)[0].tolist())


def test_the_dense_model_beside_it_and_options_that_do_not_apply(client):
    dense_name = next(model["model_name"] for model in client.server_config["models"] if model["kind"] == "embed")
    assert client.encode(["a cat"], model=dense_name).shape == (1, 32)
    with pytest.raises(ServerError, match="top_k applies to a sparse model"):
        client.encode(["a cat"], model=dense_name, top_k=3)
    for options, message in (({"precision": "int8"}, "sparse results"), ({"long_texts": "chunk"}, "takes texts"),
                             ({"top_k": 0}, "top_k must be at least 1")):
        with pytest.raises(ServerError, match=message):
            client.encode(["a cat"], **options)


def test_scipy_and_the_asyncio_client(sparse_server, reference):
    import asyncio

    async def encode():
        async with AsyncEncoderClient("127.0.0.1", sparse_server.port, sparse_server.port_out, timeout=60) as client:
            return await client.encode(TEXTS[:5])
    matrix = asyncio.run(encode()).to_scipy()
    np.testing.assert_allclose(matrix.toarray(), st_rows(reference, TEXTS[:5]), rtol=1e-4, atol=1e-6)


def test_the_wire_carries_the_entries_not_the_vocabulary(sparse_server):
    import zmq

    from encoder_client.protocol import decode_reply, encode_request, topic
    context = zmq.Context.instance()
    push, sub = context.socket(zmq.PUSH), context.socket(zmq.SUB)
    push.connect(f"tcp://127.0.0.1:{sparse_server.port}")
    sub.connect(f"tcp://127.0.0.1:{sparse_server.port_out}")
    sub.setsockopt(zmq.SUBSCRIBE, topic(b"wire-probe"))
    try:
        import json
        for _ in range(100):  # until the subscription is in place
            push.send_multipart(encode_request(b"wire-probe", 1, json.dumps(TEXTS).encode(), len(TEXTS), {"top_k": 5}))
            if sub.poll(1000):
                break
        frames = sub.recv_multipart()
        body = len(frames[2])
        assert body == (len(TEXTS) + 1) * 8 + len(TEXTS) * 5 * 8  # offsets, then 5 indices and values a row
        assert decode_reply(frames).array.shape == (len(TEXTS), 144)
    finally:
        push.close(0)
        sub.close(0)


def test_embed_sparse_in_teis_shape(sparse_server, reference):
    body = httpx.post(sparse_server.http_url + "/embed_sparse", json={"inputs": TEXTS[:4]}, timeout=30).json()
    expected = st_rows(reference, TEXTS[:4])
    for row, entries in zip(expected, body):
        assert [entry["index"] for entry in entries] == np.flatnonzero(row).tolist()
        np.testing.assert_allclose([entry["value"] for entry in entries], row[row != 0], rtol=1e-4)
    one = httpx.post(sparse_server.http_url + "/embed_sparse", json={"inputs": "a cat", "return_tokens": True,
                                                                    "top_k": 3}, timeout=30).json()
    assert len(one) == 1 and len(one[0]) == 3 and all(isinstance(entry["token"], str) for entry in one[0])


@pytest.mark.parametrize("body, status, message", [
    ({"inputs": []}, 400, "must not be an empty list"),
    ({"inputs": "a", "top_k": 0}, 400, "top_k must be at least 1"),
    ({"inputs": "a", "model": "nope"}, 404, "does not exist"),
])
def test_bad_embed_sparse_requests_are_named(sparse_server, body, status, message):
    response = httpx.post(sparse_server.http_url + "/embed_sparse", json=body, timeout=30)
    assert response.status_code == status and message in response.text, response.text


def test_a_dense_model_is_refused_on_embed_sparse_and_the_sparse_one_on_v1(sparse_server, client):
    dense_name = next(model["model_name"] for model in client.server_config["models"] if model["kind"] == "embed")
    refused = httpx.post(sparse_server.http_url + "/embed_sparse", json={"inputs": "a", "model": dense_name},
                         timeout=30)
    assert refused.status_code == 400 and "embeds; this route takes a model of kind sparse" in refused.text
    sparse_name = client.server_config["model_name"]
    refused = httpx.post(sparse_server.http_url + "/v1/embeddings", json={"input": "a", "model": sparse_name},
                         timeout=30)
    assert refused.status_code == 400 and "POST /embed_sparse" in refused.text


def test_a_large_sparse_result_comes_in_chunks_and_whole(client, reference):
    texts = random_texts(3000, seed=63)  # about 60 entries a row: 1.4 MB, streamed in chunks
    vectors = client.encode(texts)
    assert len(vectors.to_bytes()) > CHUNK_BYTES
    assert_same_sparse(vectors, st_rows(reference, texts))
