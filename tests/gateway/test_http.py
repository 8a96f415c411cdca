"""The HTTP gateway, all real processes: an encoder-server, the gateway in front of it (`encoder-server
http`), and real HTTP clients: the official openai SDK, httpx, curl and headless Chromium."""
import base64
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import free_port, random_texts, running_server, settled_status, wait_for
from http_helpers import running_gateway

pytestmark = pytest.mark.timeout(120)
API_KEY = "sk-test-0123456789"
TEXTS = ["the cat sat on the mat", "a dog", "red blue green big small", "run"]
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def model_id(gateway):
    return gateway.get("/v1/models").json()["data"][0]["id"]


@pytest.fixture
def sdk(gateway):
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def small(tiny_model, tmp_path_factory):
    """One worker, at most 50 pending texts, requests of at most 1 MB, test faults on; the gateway
    starts before the server, so it must keep trying to connect until the server comes."""
    tmp_path = tmp_path_factory.mktemp("small")
    port, port_out = free_port(), free_port()
    with running_gateway(port, port_out, tmp_path) as gateway:
        assert gateway.get("/ready").status_code == 503
        with running_server(tiny_model, "--num-worker", "1", "--max-pending-texts", "50", "--max-request-mb", "1",
                            tmp_path=tmp_path, ports=(port, port_out), env={"ENCODER_SERVER_FAULTS": "1"}) as server:
            gateway.wait_status("/ready", 200)
            yield server, gateway


def reference(server, texts):
    with server.client() as client:
        return client.encode(texts)


# ----- OpenAI's API, through the official SDK -----

def test_openai_sdk_gets_the_servers_embeddings_as_float_and_base64(sdk, model_id, tiny_server):
    expected = reference(tiny_server, TEXTS)
    as_float = sdk.embeddings.create(model=model_id, input=TEXTS, encoding_format="float")
    as_default = sdk.embeddings.create(model=model_id, input=TEXTS)  # the SDK asks for base64 and decodes it
    as_base64 = sdk.embeddings.create(model=model_id, input=TEXTS, encoding_format="base64")
    for response in (as_float, as_default, as_base64):
        assert response.model == model_id and [item.index for item in response.data] == [0, 1, 2, 3]
    np.testing.assert_allclose(_rows(as_float), expected, atol=1e-6)
    np.testing.assert_allclose(_rows(as_default), expected, atol=1e-6)
    decoded = [np.frombuffer(base64.b64decode(item.embedding), dtype="<f4") for item in as_base64.data]
    np.testing.assert_allclose(np.stack(decoded), expected, atol=1e-6)  # rows vary in the last bit with batching
    single = sdk.embeddings.create(model=model_id, input="a dog", encoding_format="float")
    np.testing.assert_allclose(_rows(single)[0], expected[1], atol=1e-6)


def test_dimensions_truncates_and_renormalizes(sdk, model_id, tiny_server):
    full = reference(tiny_server, TEXTS)
    response = sdk.embeddings.create(model=model_id, input=TEXTS, dimensions=8, encoding_format="float")
    rows = _rows(response)
    assert rows.shape == (len(TEXTS), 8)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-6)
    np.testing.assert_allclose(rows, full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True), atol=1e-6)
    for bad in (0, full.shape[1] + 1):
        with pytest.raises(openai.BadRequestError, match="dimensions"):
            sdk.embeddings.create(model=model_id, input=TEXTS, dimensions=bad)


def test_usage_counts_the_servers_tokens(sdk, model_id):
    short = sdk.embeddings.create(model=model_id, input=["cat"]).usage
    longer = sdk.embeddings.create(model=model_id, input=["cat dog bird fish tree house car road"]).usage
    assert 0 < short.prompt_tokens < longer.prompt_tokens
    assert short.total_tokens == short.prompt_tokens


def test_models_are_listed_and_unknown_models_are_not_found(sdk, model_id):
    assert [model.id for model in sdk.models.list()] == [model_id, "text-embedding-ada-002"]
    assert sdk.models.retrieve(model_id).owned_by == "encoder-server"
    with pytest.raises(openai.NotFoundError) as error:
        sdk.embeddings.create(model="text-embedding-3-small", input=TEXTS)
    assert error.value.body["code"] == "model_not_found" and error.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("text-embedding-3-small")


@pytest.mark.parametrize("body, param, words", [
    ({"model": None, "input": "a"}, "model", "model"),
    ({"input": [[1, 2, 3]]}, "input", "token-id arrays"),
    ({"input": [1, 2, 3]}, "input", "token-id arrays"),
    ({"input": ""}, "input", "empty"),
    ({"input": []}, "input", "empty list"),
    ({"input": ["ok", "  "]}, "input", "input[1]"),
    ({"input": ["ok", "\u200b\x00\ufeff"]}, "input", "input[1] is empty or whitespace-only"),
    ({"input": "a", "dimensions": True}, "dimensions", "integer"),
    ({"input": "a", "dimensions": "16"}, "dimensions", "integer"),
    ({"input": "a", "dimensions": 16.0}, "dimensions", "integer"),
    ({"input": "a", "dimensions": 10**30}, "dimensions", "between 1 and 32"),
    ({"input": "a", "dimensions": -1}, "dimensions", "between 1 and 32"),
    ({"input": "a", "encoding_format": "hex"}, "encoding_format", "encoding_format"),
])
def test_bad_embedding_requests_get_openai_errors(gateway, model_id, body, param, words):
    body = {key: value for key, value in {"model": model_id, **body}.items() if value is not None}
    response = gateway.post("/v1/embeddings", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]


def test_api_key_guards_v1_and_encode_only(tiny_server, model_id, tmp_path):
    with running_gateway(tiny_server.port, tiny_server.port_out, tmp_path, "--api-key", API_KEY) as gateway:
        gateway.wait_status("/ready", 200)
        good = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0)
        assert len(good.embeddings.create(model=model_id, input=TEXTS).data) == len(TEXTS)
        bad = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY + "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.embeddings.create(model=model_id, input=TEXTS)
        assert gateway.post("/encode", {"id": 1, "texts": TEXTS}).status_code == 401
        assert gateway.post("/encode", {"id": 1, "texts": TEXTS},
                            headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
        for path in ("/health", "/ready", "/metrics", "/", "/status.json"):
            assert gateway.get(path).status_code == 200, path


# ----- bert-as-service's HTTP API -----

def test_bert_style_encode(gateway, tiny_server):
    response = gateway.post("/encode", {"id": "req-7", "texts": TEXTS, "is_tokenized": False})
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == "req-7" and body["status"] == 200
    np.testing.assert_allclose(np.array(body["result"]), reference(tiny_server, TEXTS), atol=1e-6)

    words = [["the", "cat"], ["dog"]]
    with tiny_server.client() as client:
        expected = client.encode(words, is_tokenized=True)
    tokenized = gateway.post("/encode", {"id": 8, "texts": words, "is_tokenized": True}).json()
    np.testing.assert_allclose(np.array(tokenized["result"]), expected, atol=1e-6)
    for odd_id in (2 ** 70, {"batch": [1, "a"]}, None):  # any JSON id comes back as sent
        echoed = gateway.post("/encode", {"id": odd_id, "texts": TEXTS[:1]}).json()
        assert echoed["id"] == odd_id and len(echoed["result"]) == 1

    for texts, words in ((["ok", ""], "texts[1]"), ("not a list", "must be a list"), ([], "empty")):
        response = gateway.post("/encode", {"id": 9, "texts": texts})
        assert response.status_code == 400
        assert response.json()["id"] == 9 and response.json()["status"] == 400 and words in response.json()["error"]


# ----- Prometheus -----

def test_metrics_parse_and_move_with_traffic(gateway):
    before = scrape(gateway)
    for _ in range(3):
        assert gateway.post("/encode", {"id": 1, "texts": TEXTS}).status_code == 200

    def moved():
        after = scrape(gateway)
        return (after["encoder_requests_total", "outcome=served"] >= before["encoder_requests_total", "outcome=served"] + 3
                and after["encoder_request_seconds_count", ""] >= before["encoder_request_seconds_count", ""] + 3
                and after["encoder_inference_seconds_count", ""] > before["encoder_inference_seconds_count", ""]
                and after["encoder_texts_total", "outcome=encoded"] >= before["encoder_texts_total", "outcome=encoded"] + 12)

    wait_for(moved, timeout=15)  # the gateway polls the server's status: a scrape may show an older one
    after = scrape(gateway)
    assert after["encoder_workers_alive", ""] == 2 and after["encoder_up", ""] == 1
    assert 0 < after["encoder_padding_efficiency", ""] <= 1
    served = "encoder_gateway_http_requests_total", "method=POST,route=/encode,status=200"
    assert after[served] >= before.get(served, 0) + 3
    assert after["encoder_gateway_http_request_duration_seconds_count", "route=/encode"] >= 3
    buckets = [value for (name, _), value in after.items() if name == "encoder_request_seconds_bucket"]
    assert buckets == sorted(buckets) and buckets[-1] == after["encoder_request_seconds_count", ""]


def scrape(gateway):
    """{(sample name, "label=value,..."): value} from /metrics, parsed by prometheus_client."""
    response = gateway.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {(sample.name, ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.text) for sample in family.samples}


# ----- status codes under trouble -----

def test_busy_server_gives_429_and_the_admitted_request_succeeds(small):
    server, gateway = small
    model = gateway.get("/v1/models").json()["data"][0]["id"]
    held = ["!sleep 1.5"] + random_texts(39, seed=3)  # 40 pending texts for 1.5 s, of the 50 allowed
    results = {}
    sender = threading.Thread(target=lambda: results.update(held=gateway.post("/v1/embeddings",
                                                                               {"model": model, "input": held})))
    sender.start()
    wait_for(lambda: gateway.get("/status.json").json()["status"]["queue_depth"]["pending_texts"] >= 40, timeout=10)
    responses = [gateway.post("/v1/embeddings", {"model": model, "input": random_texts(20, seed=4)}) for _ in range(3)]
    sender.join(30)
    assert results["held"].status_code == 200 and len(results["held"].json()["data"]) == 40
    busy = [response for response in responses if response.status_code == 429]
    assert busy and all(response.status_code in (200, 429) for response in responses)
    assert busy[0].headers["retry-after"] == "1"
    assert set(busy[0].json()["error"]) == {"message", "type", "param", "code"}
    assert "busy" in busy[0].json()["error"]["message"]
    sdk = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    assert len(sdk.embeddings.create(model=model, input=random_texts(20, seed=4)).data) == 20  # room again
    too_many = gateway.post("/v1/embeddings", {"model": model, "input": random_texts(60, seed=5)})
    assert too_many.status_code == 413 and "split" in too_many.json()["error"]["message"]


def test_a_body_above_the_servers_limit_is_refused_unread(small):
    server, gateway = small
    model = gateway.get("/v1/models").json()["data"][0]["id"]
    # declared too large: the answer comes before a byte of the body is sent
    connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    connection.putrequest("POST", "/v1/embeddings")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Content-Length", str(3 << 20))
    connection.endheaders()
    response = connection.getresponse()
    error = json.loads(response.read())["error"]
    connection.close()
    assert response.status == 413 and error["code"] == "request_too_large", error
    assert "3 MB" in error["message"] and "limit of 1 MB" in error["message"]

    # sent in chunks, with no size declared: refused once it passes the limit
    def chunks():
        yield b'{"model": "%s", "input": ["' % model.encode()
        for _ in range(64):
            yield b"word " * 10_000
        yield b'"]}'

    chunked = httpx.post(f"{gateway.url}/v1/embeddings", content=chunks(),
                         headers={"Content-Type": "application/json"}, timeout=30)
    assert chunked.status_code == 413 and "more than 1 MB" in chunked.json()["error"]["message"]
    refused = gateway.post("/encode", {"id": 5, "texts": ["word " * 300_000]})
    assert refused.status_code == 413 and refused.json()["id"] is None and "1 MB" in refused.json()["error"]
    assert gateway.post("/v1/embeddings", {"model": model, "input": ["word " * 1000]}).status_code == 200
    assert gateway.get("/health").status_code == 200


def test_ready_and_embeddings_turn_503_while_no_worker_is_alive(small):
    server, gateway = small
    model = gateway.get("/v1/models").json()["data"][0]["id"]
    # freeze the workers and the supervisor too: the ventilator then drops the silent workers after
    # 5 s and nothing replaces them until SIGCONT, so "no worker alive" lasts as long as the test needs
    frozen = [*server.worker_pids(), server.process.pid]
    try:
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        not_ready = gateway.wait_status("/ready", 503, timeout=20).json()
        assert not_ready["ready"] is False and not_ready["workers_alive"] == 0
        response = gateway.post("/v1/embeddings", {"model": model, "input": TEXTS})
        assert response.status_code == 503 and "worker" in response.json()["error"]["message"]
        assert gateway.post("/encode", {"id": 3, "texts": TEXTS}).json()["status"] == 503
    finally:
        for pid in frozen:
            _continue(pid)
    gateway.wait_status("/ready", 200, timeout=60)
    assert gateway.post("/v1/embeddings", {"model": model, "input": TEXTS}).status_code == 200


def test_slow_server_gives_504(small, tmp_path):
    server, _ = small
    with running_gateway(server.port, server.port_out, tmp_path, "--timeout", "1") as gateway:
        gateway.wait_status("/ready", 200)
        model = gateway.get("/v1/models").json()["data"][0]["id"]
        started = time.monotonic()
        response = gateway.post("/v1/embeddings", {"model": model, "input": ["!sleep 3", "cat"]})
        assert response.status_code == 504 and response.json()["error"]["code"] == "timeout"
        assert time.monotonic() - started < 2.5


def test_a_draining_server_gives_503_and_still_answers_what_it_admitted(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path, env={"ENCODER_SERVER_FAULTS": "1"}) as server:
        with running_gateway(server.port, server.port_out, tmp_path) as gateway:
            gateway.wait_status("/ready", 200)
            model = gateway.get("/v1/models").json()["data"][0]["id"]
            held = {}
            sender = threading.Thread(target=lambda: held.update(response=gateway.post(
                "/v1/embeddings", {"model": model, "input": ["!sleep 3", "cat"]})))
            sender.start()
            wait_for(lambda: gateway.get("/status.json").json()["status"]["in_flight_requests"] == 1, timeout=10)
            server.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 3
            while (refused := gateway.post("/v1/embeddings", {"model": model, "input": TEXTS})).status_code == 200:
                assert time.monotonic() < deadline, "new requests were still served while draining"
                time.sleep(0.05)
            sender.join(30)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "server_unavailable"
    assert "shutting down" in refused.json()["error"]["message"]
    assert held["response"].status_code == 200 and len(held["response"].json()["data"]) == 2


def test_unreachable_server_gives_503_and_sigterm_still_stops_promptly(tmp_path):
    with running_gateway(free_port(), free_port(), tmp_path) as gateway:
        assert gateway.get("/health").status_code == 200
        assert gateway.get("/ready").status_code == 503
        response = gateway.post("/v1/embeddings", {"model": "any", "input": "cat"})
        assert response.status_code == 503 and response.json()["error"]["type"] == "server_error"
        assert gateway.get("/status.json").json()["reachable"] is False
        started = time.monotonic()
        assert gateway.stop() == 0
        assert time.monotonic() - started < 5


def test_the_readmes_curl_examples_work_as_written(gateway, model_id):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    lines = re.findall(r"^curl -s localhost:8080\S*.*?(?<!\\)$", readme.replace("\\\n", " "), re.M)
    assert len(lines) == 3, lines
    outputs = []
    for line in lines:
        # the tiny test model: another id, and 32 dimensions, fewer than the 64 the README asks for
        line = (line.replace("localhost:8080", f"127.0.0.1:{gateway.port}").replace("all-MiniLM-L6-v2", model_id)
                .replace('"dimensions": 64', '"dimensions": 16'))
        finished = subprocess.run(["bash", "-c", f"set -o pipefail; {line}"], capture_output=True, text=True,
                                  timeout=30)
        assert finished.returncode == 0 and finished.stdout, (line, finished.stderr)
        outputs.append(finished.stdout)
    embedding = json.loads(outputs[0])["data"][0]["embedding"]
    assert len(embedding) == 16 and abs(np.linalg.norm(embedding) - 1) < 1e-5
    assert json.loads(outputs[1])["status"] == 200
    assert 'encoder_requests_total{outcome="served"}' in outputs[2]


# ----- the status page, rendered by a real browser -----

@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"headless Chromium is not installed at {CHROMIUM}")
def test_status_page_renders_live_figures(gateway, tiny_server, tmp_path):
    assert gateway.post("/encode", {"id": 1, "texts": TEXTS}).status_code == 200
    with tiny_server.client() as client:
        encoded = settled_status(client)["texts"]["encoded"]
    wait_for(lambda: gateway.get("/status.json").json()["status"]["texts"]["encoded"] == encoded, timeout=10)

    dom = chromium(gateway.url, tmp_path, "--dump-dom")
    assert _text_of(dom, "workers") == "2 / 2"
    worker_rows = re.search(r'id="worker-rows">(.*?)</tbody>', dom, re.S).group(1)
    assert worker_rows.count("<tr>") == 2 and worker_rows.count("worker-") == 2
    assert _text_of(dom, "badge") == "READY"
    assert int(_text_of(dom, "texts-encoded").replace(",", "")) == encoded
    assert re.fullmatch(r"\d+\.\d", _text_of(dom, "throughput"))

    shot = tmp_path / "status.png"
    chromium(gateway.url, tmp_path, f"--screenshot={shot}", "--window-size=1280,900")
    _assert_not_blank(shot)
    if shutil.which("tesseract"):
        seen = subprocess.run(["tesseract", str(shot), "stdout", "--psm", "11"], capture_output=True, text=True,
                              timeout=60, check=True).stdout
        for label in ("Workers alive", "Throughput", "Texts encoded", "Requests served", "Latency"):
            assert label in seen, f"{label!r} not in the OCR of the screenshot:\n{seen}"
        words = seen.replace(" ", "").split()
        assert "2/2" in words and f"{encoded:,}" in words, seen


def chromium(url, tmp_path, *args):
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=5000", *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout


def _text_of(dom, element_id):
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert match, f"no element {element_id!r} in the page"
    return match.group(1).strip()


def _assert_not_blank(path):
    from PIL import Image

    image = Image.open(path).convert("L")
    assert image.size == (1280, 900)
    top = image.crop((0, 0, 1280, 420))  # the figures
    dark = sum(top.histogram()[:128])  # pixels darker than mid-grey
    assert dark > 0.01 * top.width * top.height, "the figures region of the screenshot is nearly blank"


def _rows(response):
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def _continue(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # killed and replaced while frozen
