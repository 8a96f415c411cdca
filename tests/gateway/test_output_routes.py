"""Long texts, dimensions and precisions over HTTP: the openai SDK (extra_body), /encode, and Cohere's
/v2/embed through the cohere SDK's ClientV2, each against what the ZeroMQ client gets from the same
server (several_models_server: `embedder` is the tiny random BERT, max_seq_len 64)."""
import base64

import cohere
import httpx
import numpy as np
import openai
import pytest

from conftest import random_texts

pytestmark = pytest.mark.timeout(300)
TEXTS = random_texts(6, seed=51) + [" ".join(random_texts(60, seed=52, min_words=10, max_words=10))]


@pytest.fixture(scope="module")
def zmq_client(several_models_server):
    with several_models_server.client() as client:
        yield client


def test_openai_sdk_takes_long_texts_and_precision_in_extra_body(several_models_server, zmq_client):
    sdk = openai.OpenAI(api_key="unused", base_url=several_models_server.http_url + "/v1")
    response = sdk.embeddings.create(model="embedder", input=TEXTS, encoding_format="float",
                                     extra_body={"long_texts": "chunk"})
    expected = zmq_client.encode_result(TEXTS, long_texts="chunk")
    np.testing.assert_allclose([item.embedding for item in response.data], expected.embeddings, atol=1e-6)
    assert [item.model_extra["windows"] for item in response.data] == expected.windows and expected.windows[-1] > 1
    raw = httpx.post(several_models_server.http_url + "/v1/embeddings", timeout=30, json={
        "model": "embedder", "input": TEXTS[:3], "precision": "int8", "encoding_format": "base64"}).json()
    served = np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype=np.int8) for item in raw["data"]])
    np.testing.assert_array_equal(served, zmq_client.encode(TEXTS[:3], precision="int8"))


def test_openai_dimensions_are_cut_on_the_server_and_renormalized(several_models_server, zmq_client):
    sdk = openai.OpenAI(api_key="unused", base_url=several_models_server.http_url + "/v1")
    response = sdk.embeddings.create(model="embedder", input=TEXTS[:3], dimensions=8, encoding_format="float")
    rows = np.array([item.embedding for item in response.data])
    full = zmq_client.encode(TEXTS[:3])
    np.testing.assert_allclose(rows, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-6)


def test_encode_route_says_the_windows_and_serves_each_precision(several_models_server, zmq_client):
    body = httpx.post(several_models_server.http_url + "/encode", timeout=30, json={
        "id": 7, "texts": TEXTS, "long_texts": "chunk", "dimensions": 16, "precision": "ubinary"}).json()
    expected = zmq_client.encode_result(TEXTS, long_texts="chunk", dimensions=16, precision="ubinary")
    assert body["windows"] == expected.windows and body["id"] == 7
    np.testing.assert_array_equal(np.array(body["result"], dtype=np.uint8), expected.embeddings)
    bad = httpx.post(several_models_server.http_url + "/encode", timeout=30,
                     json={"texts": TEXTS, "precision": "int3"})
    assert bad.status_code == 400 and "precision must be one of" in bad.text


def test_cohere_sdk_v2_embed_with_several_embedding_types(several_models_server, zmq_client):
    v2 = cohere.ClientV2(api_key="unused", base_url=several_models_server.http_url)
    response = v2.embed(model="embedder", texts=TEXTS, input_type="search_document",
                        embedding_types=["float", "int8", "ubinary", "binary", "uint8"], output_dimension=16)
    embeddings = response.embeddings
    np.testing.assert_allclose(embeddings.float_, zmq_client.encode(TEXTS, dimensions=16), atol=1e-6)
    for kind in ("int8", "ubinary", "binary", "uint8"):
        np.testing.assert_array_equal(getattr(embeddings, kind), zmq_client.encode(TEXTS, dimensions=16,
                                                                                   precision=kind))
    assert response.texts == TEXTS and response.meta.billed_units.input_tokens > 0


def test_cohere_truncate_none_refuses_and_chunk_embeds_whole(several_models_server, zmq_client):
    v2 = cohere.ClientV2(api_key="unused", base_url=several_models_server.http_url)
    with pytest.raises(cohere.core.ApiError) as refused:
        v2.embed(model="embedder", texts=TEXTS, input_type="search_query", embedding_types=["float"],
                 truncate="NONE")
    assert refused.value.status_code == 413 and "max_seq_len" in str(refused.value.body)
    chunked = httpx.post(several_models_server.http_url + "/v2/embed", timeout=30, json={
        "model": "embedder", "texts": TEXTS, "input_type": "search_query", "truncate": "CHUNK"}).json()
    np.testing.assert_allclose(chunked["embeddings"]["float"], zmq_client.encode(TEXTS, long_texts="chunk"),
                               atol=1e-6)


@pytest.mark.parametrize("body, message", [
    ({"texts": ["a"], "embedding_types": ["int4"]}, "embedding_types must be among"),
    ({"texts": ["a"], "embedding_types": []}, "at least one type"),
    ({"texts": ["a"], "truncate": "START"}, "START is not supported"),
    ({"texts": ["a"], "input_type": "image"}, "input_type must be one of"),
    ({"texts": ["a"], "output_dimension": 999}, "between 1 and 32"),
    ({"texts": []}, "must not be an empty list"),
    ({"texts": ["a"], "model": "reranker"}, "takes a model of kind embed"),
    ({"inputs": [{"content": "x"}]}, "inputs must be objects"),
])
def test_bad_cohere_embed_requests_are_named(several_models_server, body, message):
    response = httpx.post(several_models_server.http_url + "/v2/embed", json=body, timeout=30)
    assert response.status_code in (400, 422) and message in response.text, response.text
