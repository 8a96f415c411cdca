"""Prompts, per-request normalization and truncation, through a real server and its HTTP gateway,
on a tiny prompted model saved by sentence-transformers (query prompt by default, prompt tokens
left out of pooling), against SentenceTransformer.encode with the same choices."""
import numpy as np
import openai
import pytest

from conftest import running_server, settled_status, wait_for
from encoder_client.errors import ServerError
from http_helpers import running_gateway
from model_zoo import build_encoder, save_sentence_transformer

pytestmark = pytest.mark.timeout(300)
TEXTS = ["the cat sat on the mat", "a dog runs in the rain", "sun"]
LONG = "big red car on the road " * 40  # far above max_seq_length 48
PROMPTS = {"query": "query: ", "document": "passage: ", "empty": ""}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompted")
    encoder = build_encoder(root / "bert", "bert")
    return save_sentence_transformer(encoder, root / "prompted", pooling="mean", prompts=PROMPTS,
                                     default_prompt_name="query", include_prompt=False)


@pytest.fixture(scope="module")
def reference(model):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(model), device="cpu")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    with running_server(model, "--model-name", "prompted-mini", tmp_path=tmp_path_factory.mktemp("server")) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(server, tmp_path_factory):
    with running_gateway(server.port, server.port_out, tmp_path_factory.mktemp("gateway")) as gateway:
        gateway.wait_status("/ready", 200)
        yield gateway


def assert_same_rows(served, expected):
    cosine = (served * expected).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
    assert served.shape == expected.shape and cosine.min() >= 0.9999, cosine


def test_prompts_as_sentence_transformers_applies_them(server, reference):
    with server.client() as client:
        assert_same_rows(client.encode(TEXTS), reference.encode(TEXTS))  # the model's default_prompt_name
        assert_same_rows(client.encode(TEXTS, prompt_name="document"), reference.encode(TEXTS, prompt_name="document"))
        assert_same_rows(client.encode(TEXTS, prompt="search: "), reference.encode(TEXTS, prompt="search: "))
        assert_same_rows(client.encode(TEXTS, prompt=""), reference.encode(TEXTS, prompt=""))
        assert np.abs(client.encode(TEXTS) - client.encode(TEXTS, prompt="")).max() > 1e-3
        with pytest.raises(ServerError, match="'summary' is not one of the model's prompts .it has: document, empty, query"):
            client.encode(TEXTS, prompt_name="summary")
        with pytest.raises(TypeError, match="prompt must be a str"):
            client.encode(TEXTS, prompt=3)


def test_normalize_per_request(server, reference):
    with server.client() as client:
        normalized = client.encode(TEXTS)
        raw = client.encode(TEXTS, normalize=False)
    np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1, rtol=1e-5)
    assert np.linalg.norm(raw, axis=1).max() > 1.5
    assert_same_rows(raw, reference.encode(TEXTS, normalize_embeddings=False))


def test_truncation_is_counted_or_refused(server, gateway, reference):
    with server.client() as client:
        assert_same_rows(client.encode([LONG, "sun"]), reference.encode([LONG, "sun"]))
        with pytest.raises(ServerError, match=r"texts\[1\] has more than 48 tokens, the server's limit") as error:
            client.encode(["sun", LONG], truncate=False)
        assert error.value.code == "too_large"
        client.encode(TEXTS, truncate=False)  # short texts pass
        assert settled_status(client)["requests"]["refused"] == 1
        wait_for(lambda: client.server_status["metrics"]["truncated"] >= 1)  # it comes with a heartbeat
    response = gateway.post("/encode", {"id": 1, "texts": [LONG, LONG, "sun"]})
    assert response.status_code == 200 and response.json()["truncated"] == 2
    refused = gateway.post("/encode", {"id": 2, "texts": [LONG], "truncate": False})
    assert refused.status_code == 413 and "texts[0] has more than" in refused.text
    assert gateway.post("/encode", {"id": 3, "texts": ["a"], "normalize": "yes"}).status_code == 400
    metrics = gateway.get("/metrics").text
    assert "encoder_texts_truncated_total" in metrics


def test_openai_names_and_extra_fields(gateway, reference):
    names = [card["id"] for card in gateway.get("/v1/models").json()["data"]]
    assert names == ["prompted", "prompted-mini", "text-embedding-ada-002"]
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused")
    for name in names:
        response = client.embeddings.create(model=name, input=TEXTS, extra_body={"prompt_name": "document"})
        assert response.model == name
        rows = np.array([item.embedding for item in response.data], dtype=np.float32)
        assert_same_rows(rows, reference.encode(TEXTS, prompt_name="document"))
    with pytest.raises(openai.NotFoundError, match="prompted, prompted-mini, text-embedding-ada-002"):
        client.embeddings.create(model="text-embedding-3-large", input=TEXTS)
    with pytest.raises(openai.APIStatusError) as error:
        client.embeddings.create(model="prompted", input=[LONG], extra_body={"truncate": False})
    assert error.value.status_code == 413
