"""Random and mutated frames at the public request port and at an open worker port, and random
HTTP bodies, for a bounded time: no process dies, no worker restarts, each hostile request gets
exactly one reply, and a correct request still gets the right answer."""
import json
import time

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from conftest import random_texts, running_server

pytestmark = pytest.mark.timeout(300)


FUZZ_SECONDS = 10
FUZZ_EXAMPLES = 25  # the fewest examples a fuzz run sends, however slowly a loaded runner draws them


class _TimeUp(Exception):
    pass


def fuzz(strategy, send, seconds=FUZZ_SECONDS, at_least=FUZZ_EXAMPLES):
    """Hand `send` examples of `strategy` for `seconds`, and on until it has taken `at_least`.
    Hypothesis stops at a number of examples, not at a time, and drawing examples past the time,
    never sent, cost the runner more than the sending did; so the deadline raises, and hypothesis
    only generates (a shrink phase would shrink that exception too), reporting a failure of `send`
    as it was found."""
    stop_at, sent = time.monotonic() + seconds, 0

    @settings(max_examples=10 ** 9, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(example):
        nonlocal sent
        if sent >= at_least and time.monotonic() >= stop_at:
            raise _TimeUp
        send(example)
        sent += 1

    with pytest.raises(_TimeUp):
        run()


def loopback(context, kind, port, options=None):
    """A socket of `kind` connected to `port` on loopback (`options` set first), which never lingers
    and gives up a send after 1 s."""
    sock = context.socket(kind)
    for option, value in {zmq.LINGER: 0, zmq.SNDTIMEO: 1000, **(options or {})}.items():
        sock.setsockopt(option, value)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


VALID = [b"fuzzer", json.dumps(["the cat", "a dog ran"]).encode(), b"7", b"2",
         json.dumps({"v": 1, "is_tokenized": False, "timeout_ms": 5000}).encode()]


random_frames = st.lists(st.binary(max_size=300), min_size=1, max_size=7)


@st.composite
def mutated_requests(draw):
    frames = [bytearray(frame) for frame in VALID[:draw(st.integers(1, len(VALID)))]]
    for _ in range(draw(st.integers(1, 6))):
        frame = frames[draw(st.integers(0, len(frames) - 1))]
        position = draw(st.integers(0, max(0, len(frame) - 1)))
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and frame:
            frame[position] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del frame[position:]
        else:
            frame[position:position] = draw(st.binary(min_size=1, max_size=20))
    return [bytes(frame) for frame in frames]


def test_fuzzed_frames_kill_nothing_and_correct_requests_still_succeed(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "2", tmp_path=tmp_path) as server:
        texts = random_texts(30, seed=11)
        with server.client() as client:
            expected = client.encode(texts)
        pusher = loopback(zmq.Context.instance(), zmq.PUSH, server.port)
        fuzz(st.one_of(random_frames, mutated_requests()), pusher.send_multipart, at_least=100)
        pusher.close()
        assert server.process.poll() is None
        with server.client() as client:
            status = client.server_status
            assert status["ready"] and status["worker_restarts"] == 0
            np.testing.assert_allclose(client.encode(texts), expected, rtol=1e-5, atol=1e-6)


OPTIONS = ("v", "is_tokenized", "show_tokens", "timeout_ms", "prompt", "prompt_name", "normalize", "truncate",
           "long_texts", "dimensions", "precision", "top_k", "model", "query", "raw_scores")


WRONG = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                  st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
                  st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


OUTPUT_OPTIONS = {"long_texts": st.sampled_from(["truncate", "error", "chunk", "split"]),
                  "precision": st.sampled_from(["float32", "float16", "int8", "uint8", "binary", "ubinary", "int4"]),
                  "dimensions": st.integers(-2, 40), "top_k": st.integers(-2, 5), "normalize": st.booleans(),
                  "prompt": st.sampled_from(["", "cat: ", "dog " * 100])}


TEXT = st.text(alphabet=st.characters(codec=None, blacklist_categories=()), min_size=0, max_size=50)


@st.composite
def hostile_requests(draw):
    """Requests with odd unicode (lone surrogates included), options of every wrong type, huge
    numbers, deep nesting and large payloads, under the fuzzer's identity."""
    kind = draw(st.sampled_from(["texts", "options", "outputs", "nesting", "number", "large"]))
    texts = draw(st.lists(TEXT, min_size=1, max_size=4))
    payload = json.dumps(texts).encode()
    options = {"v": 1}
    if kind == "options":
        options[draw(st.sampled_from(OPTIONS))] = draw(WRONG)
    elif kind == "outputs":  # values of the right type, in and out of bounds, together, on long texts too
        options.update(draw(st.fixed_dictionaries({}, optional=OUTPUT_OPTIONS)))
        texts += draw(st.lists(st.integers(1, 3000).map(lambda words: "cat " * words), max_size=2))
        payload = json.dumps(texts).encode()
    elif kind == "nesting":
        depth = draw(st.integers(900, 200_000))
        payload = b"[" * depth + b"]" * depth
    elif kind == "number":
        options["timeout_ms"] = int("9" * draw(st.integers(300, 4000)))
    elif kind == "large":
        payload = json.dumps(["word " * 200_000] * draw(st.integers(1, 4))).encode()
        texts = [None] * len(json.loads(payload))
    req_id = draw(st.sampled_from([b"1", b"-1", b"99999999999999999999999", b"x"]))
    return [b"fuzzer", payload, req_id, b"%d" % len(texts), json.dumps(options).encode()]


@st.composite
def worker_port_messages(draw):
    kind = draw(st.sampled_from([b"READY", b"HEARTBEAT", b"DROPPED", b"REFUSED", b"PARTS", b"JOBS", b"WHO",
                                 b"PUBLISH", b"REGISTER", b"FORGET", b"RESET", b"DONE"]))
    header = draw(st.one_of(st.binary(max_size=64),
                            st.dictionaries(st.sampled_from(["seq", "job_id", "offset", "shape", "pid", "host",
                                                             "error", "code", "histograms", "tokens", "passes",
                                                             "truncated", "num_tokens", "remote", "bytes"]),
                                            WRONG, max_size=6).map(lambda value: json.dumps(value).encode()),
                            st.lists(st.dictionaries(st.sampled_from(["seq", "job_id", "offset", "shape", "bytes",
                                                                      "texts", "rows", "req_id"]), WRONG, max_size=5),
                                     max_size=3).map(lambda value: json.dumps(value).encode())))
    return [kind, header, *draw(st.lists(st.binary(max_size=64), max_size=2))]


def test_every_hostile_request_gets_exactly_one_reply(tiny_model, tmp_path):
    """Bad input is answered, never lost or answered twice: each hostile request, under a readable
    identity and its own req_id, gets one reply (its result or an error naming its fault)."""
    from encoder_client.protocol import decode_reply, topic

    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path) as server:
        context = zmq.Context()
        try:
            listener = loopback(context, zmq.SUB, server.port_out, {zmq.SUBSCRIBE: topic(b"fuzzer")})
            pusher = loopback(context, zmq.PUSH, server.port)
            handshake = [b"fuzzer", b"SHOW_CONFIG", b"0", b"0"]  # req_id 0: not one of the fuzzer's
            for _ in range(120):  # until the subscription has reached the sink
                pusher.send_multipart(handshake)
                if listener.poll(250):
                    break
            else:
                pytest.fail("no answer to SHOW_CONFIG in 30 s")
            sent = []

            def send(frames):
                sent.append(len(sent) + 1)
                pusher.send_multipart([*frames[:2], b"%d" % sent[-1], *frames[3:]])

            fuzz(hostile_requests(), send, seconds=FUZZ_SECONDS / 2)
            replies = []
            while listener.poll(15_000 if len(replies) < len(sent) else 1000):
                reply = decode_reply(listener.recv_multipart())
                if reply.req_id != 0:
                    replies.append(reply)
        finally:
            context.destroy(linger=0)
        assert server.process.poll() is None
    assert sorted(reply.req_id for reply in replies) == sent
    unforeseen = [reply.error for reply in replies if reply.error and "could not handle" in reply.error]
    assert not unforeseen, "requests that no check named the fault of"


def test_hostile_requests_and_worker_port_messages_kill_nothing(tiny_model, tmp_path):
    from conftest import free_port

    jobs_port = free_port(consecutive=2)
    with running_server(tiny_model, "--num-worker", "1", "--worker-port", str(jobs_port), tmp_path=tmp_path) as server:
        texts = random_texts(30, seed=12)
        with server.client() as client:
            expected = client.encode(texts)
        context = zmq.Context()
        try:
            pusher = loopback(context, zmq.PUSH, server.port)
            rogue = loopback(context, zmq.DEALER, jobs_port, {zmq.ROUTING_ID: b"fuzz/worker-0:1"})
            results = loopback(context, zmq.PUSH, jobs_port + 1)

            def send(example):
                request, message, to_results = example
                pusher.send_multipart(request)
                (results if to_results else rogue).send_multipart(message)

            fuzz(st.tuples(hostile_requests(), worker_port_messages(), st.booleans()), send)
        finally:
            context.destroy(linger=0)
        assert server.process.poll() is None
        with server.client() as client:
            np.testing.assert_allclose(client.encode(texts), expected, rtol=1e-5, atol=1e-6)
            status = client.server_status
            assert status["ready"] and status["worker_restarts"] == 0
    assert "exited unexpectedly" not in server.log


def test_hostile_http_bodies_get_4xx_never_5xx(tiny_model, tmp_path):
    import httpx

    from conftest import free_port, wait_for
    from http_helpers import status_code

    http_port = free_port()
    with running_server(tiny_model, "--num-worker", "1", "--http-port", str(http_port), tmp_path=tmp_path) as server:
        url = f"http://127.0.0.1:{http_port}"
        wait_for(lambda: status_code(url + "/ready") == 200, timeout=60)
        model = httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]
        bodies = st.one_of(
            st.builds(lambda texts, extra: {"id": 1, "texts": texts, **extra}, st.lists(TEXT, max_size=3),
                      st.dictionaries(st.sampled_from(OPTIONS + ("id", "is_tokenized")), WRONG, max_size=3)),
            st.builds(lambda texts, extra: {"model": model, "input": texts, **extra}, st.lists(TEXT, max_size=3),
                      st.dictionaries(st.sampled_from(("encoding_format", "dimensions", "user", "prompt",
                                                       "normalize", "model", "long_texts", "precision")), WRONG,
                                      max_size=3)))

        def post(body):
            path = "/encode" if "texts" in body else "/v1/embeddings"
            content = json.dumps(body, allow_nan=True)  # surrogates go out escaped, as JSON allows
            response = httpx.post(url + path, content=content, headers={"Content-Type": "application/json"},
                                  timeout=30)
            assert response.status_code < 500, (path, content[:300], response.text[:300])

        fuzz(bodies, post)
        assert server.process.poll() is None
