"""Reranking and several models over HTTP, with real third-party clients: the cohere SDK (v1 and v2
clients), LangChain's and LlamaIndex's Cohere rerankers and the openai SDK, all pointed at the
gateway of a server serving an embedder and a cross-encoder; TEI's /rerank with httpx."""
import json

import cohere
import httpx
import numpy as np
import openai
import pytest

from conftest import random_texts

pytestmark = pytest.mark.timeout(300)
QUERY = "a cat on the road by the river"
DOCUMENTS = random_texts(12, seed=41)


@pytest.fixture(scope="module")
def expected(tiny_cross_encoder):
    """(index order, scores) that sentence-transformers' CrossEncoder gives DOCUMENTS."""
    from sentence_transformers import CrossEncoder
    model = CrossEncoder(str(tiny_cross_encoder), device="cpu")
    scores = model.predict([(QUERY, document) for document in DOCUMENTS])
    return [rank["corpus_id"] for rank in model.rank(QUERY, DOCUMENTS)], scores


def test_the_cohere_sdk_v2_and_v1_clients_rerank(several_models_server, expected):
    order, scores = expected
    v2 = cohere.ClientV2(api_key="unused", base_url=several_models_server.http_url)
    response = v2.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, top_n=4)
    assert [result.index for result in response.results] == order[:4]
    np.testing.assert_allclose([r.relevance_score for r in response.results], scores[order[:4]], atol=1e-4)
    v1 = cohere.Client(api_key="unused", base_url=several_models_server.http_url)
    response = v1.rerank(model="reranker", query=QUERY, documents=DOCUMENTS, return_documents=True)
    assert [(r.index, r.document.text) for r in response.results] == [(i, DOCUMENTS[i]) for i in order]


def test_langchain_and_llama_index_cohere_rerankers(several_models_server, expected):
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank as LlamaCohereRerank

    order, scores = expected
    langchain = CohereRerank(base_url=several_models_server.http_url, cohere_api_key="unused", model="reranker",
                             top_n=3)
    kept = langchain.compress_documents([Document(page_content=text) for text in DOCUMENTS], QUERY)
    assert [document.page_content for document in kept] == [DOCUMENTS[i] for i in order[:3]]
    assert kept[0].metadata["relevance_score"] == pytest.approx(float(scores[order[0]]), abs=1e-4)
    llama = LlamaCohereRerank(base_url=several_models_server.http_url, api_key="unused", model="reranker", top_n=2)
    nodes = llama.postprocess_nodes([NodeWithScore(node=TextNode(text=text)) for text in DOCUMENTS],
                                    query_str=QUERY)
    assert [node.node.get_content() for node in nodes] == [DOCUMENTS[i] for i in order[:2]]


def test_tei_rerank_route(several_models_server, expected):
    order, scores = expected
    body = httpx.post(several_models_server.http_url + "/rerank",
                      json={"query": QUERY, "texts": DOCUMENTS, "return_text": True}, timeout=30).json()
    assert [(item["index"], item["text"]) for item in body] == [(i, DOCUMENTS[i]) for i in order]
    raw = httpx.post(several_models_server.http_url + "/rerank",
                     json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}, timeout=30).json()
    logits = np.array([item["score"] for item in sorted(raw, key=lambda item: item["index"])])
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), scores, atol=1e-4)


@pytest.mark.parametrize("path, body, status, words", [
    ("/v1/rerank", {"query": QUERY, "documents": [], "model": "reranker"}, 400, "must not be empty"),
    ("/v2/rerank", {"query": QUERY, "documents": ["a"], "top_n": 0}, 400, "top_n"),
    ("/v2/rerank", {"query": QUERY, "documents": ["a"], "model": "embedder"}, 400, "embeds"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "model": "nope"}, 404, "does not exist"),
    ("/v2/rerank", {"query": " ", "documents": ["a"]}, 400, "query"),
    ("/v2/rerank", {"query": QUERY, "documents": [{"title": "no text"}]}, 400, "documents[0]"),
    ("/rerank", {"query": QUERY, "texts": ["a", "\u200b"]}, 400, "texts[1]"),
    ("/rerank", {"query": QUERY, "texts": ["a", "\ud800"]}, 400, "texts[1]"),  # a lone surrogate
    ("/v2/rerank", {"query": "\ud800", "documents": ["a"], "return_documents": True}, 400, "query"),
    ("/v1/rerank", {"query": QUERY, "documents": ["a"], "model": "\ud800"}, 404, "does not exist"),
])
def test_bad_rerank_requests_get_errors_that_say_why(several_models_server, path, body, status, words):
    """The bodies go as ASCII JSON, so that lone surrogates travel as escapes."""
    response = httpx.post(several_models_server.http_url + path, content=json.dumps(body),
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == status and words in response.text, response.text


def test_the_openai_sdk_embeds_with_each_embedder_and_lists_every_model(several_models_server):
    client = openai.OpenAI(api_key="unused", base_url=several_models_server.http_url + "/v1")
    texts = random_texts(3, seed=42)
    with several_models_server.client() as ours:
        expected = ours.encode(texts, model="embedder")
    for name in ("embedder", "queries"):
        rows = [item.embedding for item in client.embeddings.create(model=name, input=texts).data]
        np.testing.assert_allclose(rows, expected, atol=1e-5)
    cards = {card.id: (card.kind, card.dimensions) for card in client.models.list().data}
    assert cards["embedder"] == ("embed", 32) and cards["reranker"] == ("rerank", 1)
    with pytest.raises(openai.NotFoundError, match="does not exist; this server serves embedder, queries, "):
        client.embeddings.create(model="nope", input=texts)
    with pytest.raises(openai.BadRequestError, match="reranker"):
        client.embeddings.create(model="reranker", input=texts)
    ready = httpx.get(several_models_server.http_url + "/ready", timeout=30).json()
    assert ready["models"] == {"embedder": True, "reranker": True}
    metrics = httpx.get(several_models_server.http_url + "/metrics", timeout=30).text
    assert 'encoder_model_ready{model="reranker"} 1.0' in metrics
