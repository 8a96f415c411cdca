"""Hostile and malformed requests at the public ports: each gets an error that names the problem,
no process dies, and other clients never notice. Real processes on loopback."""
import json
import os

import numpy as np
import pytest
import zmq

from conftest import (FAULTS, peak_rss_mb, random_texts, raw_push, raw_sockets, raw_sub, replies, running_server,
                      settled_status, wait_for)
from encoder_client import ServerError
from encoder_client.protocol import decode_reply, topic
from http_helpers import authorized

pytestmark = pytest.mark.timeout(300)
JSON_BODY = {"Content-Type": "application/json"}


@pytest.fixture
def server(one_worker_server):
    return one_worker_server


def test_lone_surrogates_are_refused_at_intake_and_no_worker_dies(server, keyed_gateway):
    push, sub = raw_sockets(server, b"surrogates")
    for req_id in range(6):
        push.send_multipart([b"surrogates", b'["fine", "\\ud800"]', b"%d" % req_id, b"2"])
    errors = replies(sub, 6)
    assert len(errors) == 6 and all("texts[1] holds a lone surrogate (U+D800)" in e[1]["error"] for e in errors)
    model = keyed_gateway.get("/v1/models", **authorized()).json()["data"][0]["id"]
    body = '{"model": "%s", "input": ["ok", "\\udfff"]}' % model
    openai = keyed_gateway.post("/v1/embeddings", None, content=body, **authorized(**JSON_BODY))
    assert openai.status_code == 400 and "lone surrogate" in openai.json()["error"]["message"], openai.text
    bert = keyed_gateway.post("/encode", None, content='{"id": 1, "texts": ["\\ud83d"]}', **authorized())
    assert bert.status_code == 400 and "lone surrogate" in bert.json()["error"], bert.text
    with server.client() as client:
        with pytest.raises(ValueError, match="lone surrogate"):
            client.encode(["\ud800"])
        assert client.encode(["a cat"]).shape == (1, 32)
        assert client.server_status["worker_restarts"] == 0


@pytest.mark.parametrize("bomb", ["the cat sat " * 900_000, "a" * 10_000_000], ids=["words", "no-spaces"])
def test_a_10_mb_text_is_cut_before_the_tokenizer_and_keeps_the_worker_flat(server, bomb):
    """A tokenizer's memory grows with its input: a 10 MB text once took a worker to 1.1 GB and
    killed it. Its embedding is that of its first max_seq_len tokens, as for any long text."""
    with server.client() as client:
        client.encode(["warm up " * 40] * 8)
        (worker,) = server.worker_pids()
        before = peak_rss_mb(worker)
        rows = client.encode([bomb, "a dog"])
        prefix = client.encode([bomb[:3000], "a dog"])
        after = peak_rss_mb(worker)
        assert client.server_status["worker_restarts"] == 0
    np.testing.assert_allclose(rows, prefix, rtol=1e-5, atol=1e-6)
    assert after - before < 100, f"the worker's peak RSS grew by {after - before:.0f} MB"


def test_a_huge_prompt_is_refused_at_intake_and_never_reaches_a_worker(server, keyed_gateway):
    """A prompt is put before every text of its request and travels in every job: a 20 MB one on
    256 one-letter texts once took a worker to 1.4 GB. One longer than 8 characters per token of
    max_seq_len (which it could never leave room in) is refused; one at that bound is served."""
    with server.client() as client:
        limit = 8 * client.server_config["truncate_at"]
        (worker,) = server.worker_pids()
        before = peak_rss_mb(worker)
        with pytest.raises(ServerError, match="the prompt has 10000000 characters.*shorten the prompt") as error:
            client.encode(["a"] * 256, prompt="word " * 2_000_000)
        assert error.value.code == "too_large"
        assert client.encode(["a", "b"], prompt="p" * limit).shape == (2, 32)
        assert peak_rss_mb(worker) - before < 100
        assert client.server_status["worker_restarts"] == 0
    model = keyed_gateway.get("/v1/models", **authorized()).json()["data"][0]["id"]
    body = {"model": model, "input": ["a"] * 16, "prompt": "word " * 200_000}
    openai = keyed_gateway.post("/v1/embeddings", body, **authorized())
    assert openai.status_code == 413 and "shorten the prompt" in openai.json()["error"]["message"], openai.text


def test_one_hostile_request_never_ends_the_ventilator(server):
    """Each of these once raised an exception in the ventilator's loop, and the server exited 1."""
    push, sub = raw_sockets(server, b"hostile")
    hostile = [
        [b"hostile", b'["a"]', b"1", b"1", b'{"timeout_ms": 1' + b"0" * 400 + b"}"],
        [b"hostile", b"[" * 100000 + b"]" * 100000, b"2", b"1"],
        [b"hostile", b'["a"]', b"3", b"1", b'{"a":' * 50000 + b"1" + b"}" * 50000],
        [b"hostile", b'["a"]', b"4", b"1", b'{"timeout_ms": Infinity}'],
        [b"hostile", b'["a"]', b"5", b"1", b'{"is_tokenized": "yes"}'],
        [b"hostile", b'["a"]', b"-6", b"1"],
    ]
    for frames in hostile:
        push.send_multipart(frames)
    errors = replies(sub, len(hostile))
    assert len(errors) == len(hostile) and all(e[1]["code"] == "bad_request" for e in errors), errors
    with server.client() as client:
        assert client.encode(["still serving"]).shape == (1, 32)
    assert server.process.poll() is None


def test_a_request_id_already_in_flight_is_refused(server):
    push, sub = raw_sockets(server, b"twice")
    payload = json.dumps(random_texts(3000, seed=3, min_words=20)).encode()
    for _ in range(2):
        push.send_multipart([b"twice", payload, b"77", b"3000"])
    got = replies(sub, 2, timeout_ms=60000)
    errors = [reply for _, reply, frames in got if "error" in reply]
    results = [frames for _, reply, frames in got if "error" not in reply]
    assert len(errors) == 1 and "req_id 77 is already in flight" in errors[0]["error"]
    assert len(results) == 1 and json.loads(results[0][1])["shape"] == [3000, 32]


def _hostile_frame_sets(identity):
    return [
        ("wrong frame count", [identity, b'["a"]']),
        ("bad JSON", [identity, b'["unclosed', b"1", b"1"]),
        ("not a list of strings", [identity, b'{"a": 1}', b"2", b"1"]),
        ("list with a number", [identity, b'["ok", 5]', b"3", b"2"]),
        ("non-numeric id", [identity, b'["ok"]', b"abc", b"1"]),
        ("lying msg_len", [identity, b'["ok", "fine"]', b"5", b"7"]),
        ("1 MB binary junk", [identity, os.urandom(1 << 20), b"6", b"1"]),
        ("empty string", [identity, b'[""]', b"7", b"1"]),
        ("options not an object", [identity, b'["ok"]', b"8", b"1", b"[1, 2]"]),
    ]


def test_hostile_frames_get_error_replies_and_others_never_notice(tiny_server):
    context = zmq.Context.instance()
    identity = b"hostile-peer"
    sender = context.socket(zmq.PUSH)
    receiver = context.socket(zmq.SUB)
    receiver.setsockopt(zmq.SUBSCRIBE, identity + b"\0")
    for sock, port in ((sender, tiny_server.port), (receiver, tiny_server.port_out)):
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://127.0.0.1:{port}")
    with tiny_server.client() as bystander:
        stream = iter(bystander.encode_async(iter([random_texts(40, seed=i) for i in range(20)])))
        first = next(stream)  # a well-behaved client is mid-stream while the junk arrives
        receiver.poll(500)  # let the subscription settle (the frames below are not retried)
        cases = _hostile_frame_sets(identity)
        for _, frames in cases:
            sender.send_multipart(frames)
        sender.send_multipart([b"x" * 5000, b"[]", b"1", b"0"])  # unreadable identity: logged, dropped
        errors = []
        while receiver.poll(5000) and len(errors) < len(cases):
            frames = receiver.recv_multipart()
            assert frames[0] == identity + b"\0"
            reply = json.loads(frames[1])
            assert reply["code"] == "bad_request", reply
            errors.append(reply["error"])
        rest = list(stream)
        big_text = bystander.encode(["the cat " * 25000])  # a 200 kB text is truncated, not refused
        assert bystander.server_status["workers_alive"] == 2
    assert len(errors) == len(cases), errors
    assert all(error.startswith("bad request") for error in errors)
    joined = " | ".join(errors)
    for fragment in ("4 or 5 frames", "not valid JSON", "must be a list", "texts[1]", "req_id",
                     "msg_len is 7", "texts[0]", "options"):
        assert fragment in joined
    assert first.shape == (40, 32) and len(rest) == 19 and big_text.shape == (1, 32)
    sender.close()
    receiver.close()


def test_a_flood_of_bad_requests_gets_every_reply_and_a_log_line_per_10_seconds(tiny_server):
    """Each bad request gets its error reply, but the log, which any client could otherwise fill at
    will (a fuzzer's 90,000 bad requests in 100 s once made 90,000 lines, 10 MB), gets one line
    per 10 s."""
    identity, count = b"flooding-peer", 3000
    sender, receiver = raw_push(tiny_server), raw_sub(tiny_server, topic(identity))
    before = tiny_server.log.count("bad request from")
    for req_id in range(count):
        sender.send_multipart([identity, b'[""]', b"%d" % req_id, b"1"])
    codes = [body["code"] for _, body, _ in replies(receiver, count)]
    assert codes == ["bad_request"] * count
    assert tiny_server.log.count("bad request from") - before <= 2
    sender.close()
    receiver.close()


def test_huge_payloads_of_empty_lists_are_refused_before_parsing_and_no_worker_is_lost(small_queue_server):
    """Requests of 40 MB of `[[],[],...]` once held the ventilator's loop for seconds each while it
    parsed them: workers went unheard, were killed as silent, and innocent requests failed."""
    with small_queue_server.client() as client:
        before = client.server_status
        identity = b"lists"
        sub, push = raw_sub(small_queue_server, identity + b"\0"), raw_push(small_queue_server)
        payload = b"[" + b"[]," * 13_000_000 + b"[]]"
        for req_id in range(4):
            push.send_multipart([identity, payload, b"%d" % req_id, b"1"])
        texts = ["a good request"] * 20
        for _ in range(5):
            assert client.encode(texts).shape == (20, 32)
        errors = [decode_reply(sub.recv_multipart()) for _ in range(4) if sub.poll(30_000)]
        assert [error.code for error in errors] == ["too_large"] * 4, errors
        assert "payload holds 13000002 JSON lists or objects; a request has at most 2001" in errors[0].error
        after = client.server_status
        assert after["worker_restarts"] == before["worker_restarts"], small_queue_server.log
        assert after["jobs_redispatched"] == before["jobs_redispatched"], small_queue_server.log


def test_a_result_too_large_to_hold_is_refused_at_admission(tiny_model, tmp_path):
    """Token-level pooling: the tiny model's text is up to 64 rows of 32 floats (8 KB), so 1 MB
    holds 128 texts. A larger request is refused before any of it is computed, instead of taking
    the sink's memory (100,000 texts of the bundled model would need about 37 GB)."""
    with running_server(tiny_model, "--num-worker", "1", "--pooling-strategy", "none", "--max-result-mb", "1",
                        tmp_path=tmp_path) as server:
        with server.client() as client:
            assert len(client.encode(["a short text"] * 120)) == 120
            with pytest.raises(ServerError, match=r"the result of 200 texts at up to 64 tokens each could take "
                                                  r"2 MB, above the server's limit of 1 MB") as error:
                client.encode(["a short text"] * 200)
            assert error.value.code == "too_large"
            status = settled_status(client)  # a reply can reach its client before the server counts it
            assert status["texts"]["encoded"] == 120 and status["requests"]["refused"] == 0


def test_poisoned_input_fails_only_its_request_and_the_server_recovers(tiny_model, tmp_path):
    poisoned = random_texts(100, seed=3)
    poisoned[57] = "!crash here"
    bystander_texts = random_texts(40, seed=4)
    with running_server(tiny_model, "--num-worker", "2", "--max-batch-size", "16", tmp_path=tmp_path,
                        env=FAULTS) as server:
        with server.client() as victim, server.client() as bystander:
            expected = bystander.encode(bystander_texts)
            victim.encode(poisoned, blocking=False)
            for _ in range(5):
                np.testing.assert_allclose(bystander.encode(bystander_texts), expected, rtol=1e-4, atol=1e-5)
            with pytest.raises(ServerError, match="texts 48 to 63 of this request made a worker crash twice"):
                victim.fetch_all()
            wait_for(lambda: server.status()["ready"])
            np.testing.assert_allclose(victim.encode(bystander_texts), expected, rtol=1e-4, atol=1e-5)
        status = server.status()
        assert status["requests"]["failed"] == 1 and status["worker_restarts"] == 2


def test_oversized_request_is_refused_and_costs_the_server_nothing(tiny_model, tmp_path):
    with running_server(tiny_model, "--max-request-mb", "1", tmp_path=tmp_path) as server:
        with server.client(timeout=10) as client:
            with pytest.raises(ValueError, match="above the server's limit of 1 MB"):
                client.encode(["word " * 300_000])
            hostile = zmq.Context().socket(zmq.PUSH)  # its own context: its I/O is none of the client's
            hostile.connect(f"tcp://127.0.0.1:{server.port}")
            hostile.send_multipart([b"hostile", os.urandom(3 << 20), b"1", b"1"])  # ZeroMQ drops the peer
            assert client.encode(["still fine"]).shape == (1, 32)
            assert client.server_status["ready"]
            hostile.context.destroy(linger=0)
