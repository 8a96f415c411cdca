"""One server, two models (an embedder and a cross-encoder) from a models file: each request goes to
the model it names, embeddings equal sentence-transformers', scores equal CrossEncoder.predict's,
on every client, and a flood on one model does not hold up the other's requests."""
import asyncio
import json

import numpy as np
import pytest
from bert_serving.client import BertClient

from conftest import WORDS, random_texts, reference_embeddings
from encoder_client import AsyncEncoderClient, ConcurrentEncoderClient, ServerError

pytestmark = pytest.mark.timeout(600)
QUERY = "a cat on the road by the river"


@pytest.fixture(scope="module")
def cross_encoder(tiny_cross_encoder):
    from sentence_transformers import CrossEncoder
    return CrossEncoder(str(tiny_cross_encoder), device="cpu")


def predicted(cross_encoder, documents, query=QUERY):
    return cross_encoder.predict([(query, document) for document in documents])


def test_each_request_goes_to_the_model_it_names(several_models_server, tiny_model):
    texts = random_texts(40, seed=31)
    expected = reference_embeddings(tiny_model, texts)
    with several_models_server.client() as client:
        for model in (None, "embedder", "queries"):
            np.testing.assert_allclose(client.encode(texts, model=model), expected, atol=1e-5)
        config, status = client.server_config, client.server_status
    assert [(m["model_name"], m["kind"], m["embedding_dim"]) for m in config["models"]] == [
        ("embedder", "embed", 32), ("reranker", "rerank", 1)]
    assert status["ready"] and {name: model["ready"] for name, model in status["models"].items()} == {
        "embedder": True, "reranker": True}


def test_rerank_equals_cross_encoder_predict_and_rank_on_every_client(several_models_server, cross_encoder):
    documents = random_texts(30, seed=32)
    expected = predicted(cross_encoder, documents)
    order = [rank["corpus_id"] for rank in cross_encoder.rank(QUERY, documents)]
    with several_models_server.client() as client:
        results = client.rerank(QUERY, documents, model="reranker")
        assert [index for index, _ in results] == order
        np.testing.assert_allclose([score for _, score in sorted(results)], expected, atol=1e-4)
        assert client.rerank(QUERY, documents) == results  # no model named: the first reranker
        top = client.rerank(QUERY, documents, top_n=3, return_documents=True)
        assert [(index, documents[index]) for index in order[:3]] == [(index, text) for index, _, text in top]
        raw = client.rerank(QUERY, documents, raw_scores=True)
        np.testing.assert_allclose(1 / (1 + np.exp(-np.array([score for _, score in sorted(raw)]))), expected,
                                   atol=1e-4)

    async def from_asyncio():
        async with AsyncEncoderClient(port=several_models_server.port, port_out=several_models_server.port_out,
                                      timeout=60) as client:
            return await asyncio.gather(*(client.rerank(QUERY, documents, model="reranker") for _ in range(4)))

    assert all(result == results for result in asyncio.run(from_asyncio()))
    with ConcurrentEncoderClient(max_concurrency=2, port=several_models_server.port,
                                 port_out=several_models_server.port_out, timeout=60) as client:
        assert client.rerank(QUERY, documents, model="reranker") == results


def test_a_long_document_list_is_split_into_jobs_and_comes_back_whole(several_models_server, cross_encoder):
    documents = random_texts(150, seed=33, max_words=60)  # above the reranker's max_batch_size of 16
    with several_models_server.client() as client:
        scores = [score for _, score in sorted(client.rerank(QUERY, documents))]
    np.testing.assert_allclose(scores, predicted(cross_encoder, documents), atol=1e-4)


def test_wrong_model_names_kinds_and_queries_get_errors_that_say_why(several_models_server):
    with several_models_server.client() as client:
        with pytest.raises(ServerError, match="'nope' is not served here; the models are: embedder, reranker") as error:
            client.encode(["a text"], model="nope")
        assert error.value.code == "not_found"
        with pytest.raises(ServerError, match="'reranker' is a reranker"):
            client.encode(["a text"], model="reranker")
        with pytest.raises(ServerError, match="'embedder' is an embedder"):
            client.rerank(QUERY, ["a text"], model="embedder")
        with pytest.raises(ServerError, match="the query has .* tokens.*shorten the query"):
            client.rerank(" ".join(WORDS), ["a text"])
        with pytest.raises(ServerError, match="max_seq_len") as error:
            client.rerank(QUERY, ["short", " ".join(WORDS * 3)], truncate=False)
        assert error.value.code == "too_large"
        with pytest.raises(ValueError, match="query"):
            client.rerank("   ", ["a text"])
        assert len(client.rerank(QUERY, ["still serving"])) == 1


def test_bert_serving_client_gets_the_default_model(several_models_server, tiny_model):
    texts = random_texts(5, seed=34)
    client = BertClient("127.0.0.1", several_models_server.port, several_models_server.port_out,
                        check_version=False, timeout=60000)
    try:
        np.testing.assert_allclose(client.encode(texts), reference_embeddings(tiny_model, texts), atol=1e-5)
    finally:
        client.close()


def test_a_flood_on_the_embedder_does_not_queue_the_rerankers_requests(several_models_server):
    """While the embedder's queue is long, rerank requests are answered: they wait in no queue of
    the embedder's (the benchmark's `models` scenario measures the latency)."""
    flood = [random_texts(2000, seed=seed) for seed in range(12)]
    with several_models_server.client() as flooder, several_models_server.client() as client:
        for texts in flood:
            flooder.encode(texts, blocking=False)
        for _ in range(5):
            assert len(client.rerank(QUERY, ["a cat", "a dog"])) == 2
        embedder = client.server_status["models"]["embedder"]
        assert embedder["queue_depth"]["bulk"] > 0, "the flood ended before the rerank requests did"
        assert [len(result) for result in flooder.fetch_all()] == [2000] * 12


@pytest.mark.parametrize("options, words", [
    ({"query": 5}, "query must be a str"), ({"model": ["reranker"]}, "model must be a str"),
    ({"query": "q", "raw_scores": "yes"}, "raw_scores must be a bool"), ({"query": "\u200b"}, "query is empty"),
    ({"query": "q", "show_tokens": True}, "show_tokens"), ({"model": "x" * 10_000}, "is not served here"),
    ({"query": "q " * 100_000}, "shorten the query"), ({"query": "q", "prompt": "p: "}, "takes no prompt")])
def test_malformed_rerank_and_model_options_get_errors_and_the_server_serves_on(several_models_server, options,
                                                                                words):
    from conftest import raw_sockets, replies

    push, sub = raw_sockets(several_models_server, b"hostile-rerank")
    push.send_multipart([b"hostile-rerank", json.dumps(["a document"]).encode(), b"7", b"1",
                         json.dumps(options).encode()])
    (reply,) = replies(sub, 1)
    assert words in reply[1]["error"], reply[1]
    with several_models_server.client() as client:
        assert len(client.rerank(QUERY, ["still serving"])) == 1
