"""LangChain's and LlamaIndex's OpenAI embedding classes against the HTTP gateway, each configured
as its own documentation says for an OpenAI-compatible server, against the ZeroMQ client's rows."""
import numpy as np
import pytest


pytestmark = pytest.mark.timeout(180)
TEXTS = ["the cat sat on the mat", "a dog\nruns", "red blue green big small", "run"]


@pytest.fixture(scope="module")
def model_name(gateway):
    return gateway.get("/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def expected(tiny_server):
    with tiny_server.client() as client:
        return client.encode(TEXTS), client.encode(["the cat sat on the mat", "a dog runs"])


def test_langchain_openai_embeddings(gateway, model_name, expected):
    from langchain_openai import OpenAIEmbeddings

    # offline, LangChain can only send text: its default token-id input needs tiktoken's download
    embeddings = OpenAIEmbeddings(base_url=gateway.url + "/v1", api_key="unused", check_embedding_ctx_length=False)
    documents = np.array(embeddings.embed_documents(TEXTS), dtype=np.float32)  # the default model name
    np.testing.assert_allclose(documents, expected[0], atol=1e-5)
    named = OpenAIEmbeddings(model=model_name, base_url=gateway.url + "/v1", api_key="unused",
                             check_embedding_ctx_length=False)
    np.testing.assert_allclose(named.embed_query(TEXTS[0]), expected[0][0], atol=1e-5)


def test_llama_index_openai_like_embedding(gateway, model_name, expected):
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    embedding = OpenAILikeEmbedding(model_name=model_name, api_base=gateway.url + "/v1", api_key="unused")
    rows = np.array(embedding.get_text_embedding_batch(TEXTS[:2]), dtype=np.float32)
    np.testing.assert_allclose(rows, expected[1], atol=1e-5)  # it sends newlines as spaces
    np.testing.assert_allclose(embedding.get_query_embedding(TEXTS[0]), expected[0][0], atol=1e-5)


def test_llama_index_openai_embedding_by_its_default_name(gateway, expected):
    from llama_index.embeddings.openai import OpenAIEmbedding

    # its model= must be one of OpenAI's names, so it is left at its default, text-embedding-ada-002
    embedding = OpenAIEmbedding(api_base=gateway.url + "/v1", api_key="unused")
    np.testing.assert_allclose(embedding.get_text_embedding(TEXTS[0]), expected[0][0], atol=1e-5)
