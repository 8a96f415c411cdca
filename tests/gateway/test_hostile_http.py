"""Hostile HTTP requests to the gateway: 4xx in each route's own shape, never a 5xx, and the API
key checked before the body is read."""
import http.client
import json

import pytest

from http_helpers import authorized

pytestmark = pytest.mark.timeout(300)
JSON_BODY = {"Content-Type": "application/json"}


def test_deep_nesting_and_non_numbers_get_400_in_each_routes_shape(keyed_gateway):
    deep = "[" * 100_000 + "]" * 100_000
    for body, words in ((deep, "nested too deeply"), ('{"id": %s, "texts": ["a"]}' % deep, "nested too deeply"),
                        ('{"id": NaN, "texts": ["a"]}', "NaN is not a JSON number"),
                        ('{"id": 1e999, "texts": ["a"]}', "too large for a number"),
                        ('{"id": %s, "texts": ["a"]}' % ("[" * 40 + "]" * 40), "id is nested more than 32")):
        response = keyed_gateway.post("/encode", None, content=body, **authorized())
        assert response.status_code == 400, (words, response.text)
        assert response.json()["status"] == 400 and words in response.json()["error"]
    response = keyed_gateway.post("/v1/embeddings", None, content=deep, **authorized(**JSON_BODY))
    assert response.status_code == 400 and "error" in response.json(), response.text
    assert keyed_gateway.post("/encode", {"id": {"batch": [1, "a"]}, "texts": ["a"]}, **authorized()).status_code == 200


def test_the_api_key_is_checked_before_the_body_is_read(keyed_gateway):
    """A keyless client declares a 50 MB body and sends none: the 401 comes at once, before any byte."""
    connection = http.client.HTTPConnection("127.0.0.1", keyed_gateway.port, timeout=5)
    connection.putrequest("POST", "/v1/embeddings")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(50 << 20))
    connection.endheaders()
    response = connection.getresponse()  # raises socket.timeout if the gateway waits for the body
    assert response.status == 401 and json.loads(response.read())["error"]["code"] == "invalid_api_key"
    connection.close()


def test_lone_surrogates_quoted_back_are_escaped_not_a_500(keyed_gateway):
    """A JSON escape such as \\ud800 decodes to a lone surrogate, which UTF-8 cannot encode; an error
    message that quotes it (an unknown model's name) or an id echoed back still makes a response,
    the surrogate escaped again, so the client reads back what it sent."""
    lone = "\ud800x"
    for path, body, status in (("/encode", {"id": lone, "texts": None}, 400),
                               ("/encode", {"id": lone, "texts": ["a"], "is_tokenized": lone}, 400),
                               ("/v2/embed", {"model": lone, "texts": ["a"], "input_type": "search_query",
                                              "embedding_types": ["float"]}, 404),
                               ("/embed_sparse", {"model": lone, "inputs": ["a"]}, 404),
                               ("/rerank", {"model": lone, "query": "a", "texts": ["b"]}, 404),
                               ("/encode", {"id": lone, "texts": ["a"]}, 200)):
        content = json.dumps(body)  # ASCII, the surrogate as an escape
        response = keyed_gateway.post(path, None, content=content, **authorized(**JSON_BODY))
        assert response.status_code == status, (path, body, response.text)
        answer = json.loads(response.content)  # raises if the body is not JSON
        if path == "/encode":
            assert answer["id"] == lone, answer
        elif status == 404:
            assert lone in json.dumps(answer, ensure_ascii=False), answer
