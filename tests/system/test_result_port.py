"""The result port: who may subscribe to what, results streamed in chunks, and clients that never
read, which cost the sink a bounded size and are told why their results were dropped."""
import asyncio
import json
import time
import uuid

import numpy as np
import pytest
import zmq

from conftest import raw_push, raw_sub, rss_mb, running_server, settled_status, sink_pid, wait_for
from encoder_client import AsyncEncoderClient

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def server(one_worker_server):
    return one_worker_server


def test_only_exact_identities_may_subscribe(server):
    """A raw SUB with an empty topic, or a prefix of a client's identity, once received every
    client's embeddings."""
    context = zmq.Context.instance()
    eavesdroppers = []
    with server.client(identity="victim-client-0001") as client:
        for topic in (b"", b"victim", b"v"):
            sub = context.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, topic)
            sub.connect(f"tcp://127.0.0.1:{server.port_out}")
            eavesdroppers.append(sub)
        time.sleep(0.5)
        assert client.encode(["a secret sentence"]).shape == (1, 32)
    for sub in eavesdroppers:
        assert not sub.poll(1000), "an eavesdropper received a client's reply"
        sub.close()
    assert "refused a subscription" in server.log


def test_no_subscription_keeps_a_new_client_from_its_results(server):
    """Sixteen one-character topics (every UUID starts with one) once made the sink refuse every
    new client's subscription as overlapping, and each client timed out connecting."""
    with server.client(timeout=5) as early:  # one that was there first
        hostile = raw_sub(server, *(b"%x" % n for n in range(16)), b"", b"a", b"ab\0", early.identity[:-1],
                          early.identity[:-1] + b"\0", early.identity[:8])
        try:
            for _ in range(5):
                started = time.monotonic()
                with server.client(timeout=5) as client:
                    assert client.encode(["a good request"]).shape == (1, 32)
                assert time.monotonic() - started < 2.0
            assert early.encode(["the first client still works"]).shape == (1, 32)
            assert not hostile.poll(500), "a subscriber received a reply for an identity it did not name in full"
        finally:
            hostile.close()
    assert "refused a subscription" in server.log


def test_a_subscriber_receives_only_the_identity_it_names_in_full(server):
    """"a" never sees "ab"'s replies, nor a prefix or the empty subscription anyone's; a raw
    subscriber to "a"'s whole topic gets "a"'s."""
    eavesdroppers = [raw_sub(server, topic) for topic in (b"", b"a", b"ab", b"a\0")]
    try:
        with server.client(identity="ab", timeout=5) as client:
            client.encode(["a secret sentence"])
        for sub in eavesdroppers:
            assert not sub.poll(300), "an eavesdropper received another identity's reply"
        with server.client(identity="a", timeout=5) as client:
            result = client.encode(["for a"])
        received = []  # "a"'s handshake (more than one if a reply was slow), then its result
        while eavesdroppers[-1].poll(5000) and (not received or received[-1][2] != result.tobytes()):
            received.append(eavesdroppers[-1].recv_multipart())
        assert {frames[0] for frames in received} == {b"a\0"} and received[-1][2] == result.tobytes()
    finally:
        for sub in eavesdroppers:
            sub.close()


@pytest.fixture(scope="module")
def token_level(tiny_model, tmp_path_factory):
    """Results of 8 KB a text (64 tokens x 32 values), at most 16 MB a request: 32 MB unread per client."""
    with running_server(tiny_model, "--num-worker", "2", "--pooling-strategy", "none", "--max-result-mb", "16",
                        tmp_path=tmp_path_factory.mktemp("token-level")) as server:
        yield server


LONG_TEXTS = [f"text number {i} " + "word " * 70 for i in range(1900)]  # 15 MB of results


def test_a_large_result_is_streamed_and_put_back_together_by_both_clients(token_level):
    with token_level.client() as client:
        pieces = np.concatenate([client.encode(LONG_TEXTS[start:start + 10]) for start in range(0, 1000, 10)])
        whole = client.encode(LONG_TEXTS[:1000])  # 8 MB: 8 chunks
    assert whole.shape == (1000, 64, 32)
    np.testing.assert_array_equal(whole, pieces)

    async def encode_async():
        async with AsyncEncoderClient("127.0.0.1", token_level.port, token_level.port_out, timeout=60) as client:
            return await client.encode(LONG_TEXTS[:1000])

    np.testing.assert_array_equal(asyncio.run(encode_async()), pieces)


def test_an_old_protocol_client_that_never_reads_costs_the_sink_a_bounded_size(token_level):
    """bert-serving-client's frames under a UUID that a SUB subscribes to and never reads: each
    whole result was queued for it, with nothing to stop the next (1.4 GB for 8 results in the
    report). Now the sink keeps at most --max-unread-mb for it, drops the rest with an error, and
    abandons its queued work; other clients never notice."""
    identity = str(uuid.uuid4()).encode()
    sink = sink_pid(token_level)
    base = rss_mb(sink)
    # the old client subscribes to its bare identity; this one keeps next to nothing itself
    sub = raw_sub(token_level, identity, options={zmq.RCVHWM: 1, zmq.RCVBUF: 64 << 10})
    push = raw_push(token_level, {zmq.SNDHWM: 0})
    payload = json.dumps(LONG_TEXTS).encode()
    try:
        with token_level.client(timeout=30) as client:
            for req_id in range(12):
                push.send_multipart([identity, payload, b"%d" % req_id, b"%d" % len(LONG_TEXTS)])
            wait_for(lambda: client.server_status["requests"]["abandoned"] >= 1, timeout=120)
            status = settled_status(client, timeout=120)
            assert status["replies_dropped"] >= 1
            assert client.encode(["an honest client"]).shape == (1, 64, 32)
        peak = rss_mb(sink, peak=True)
        # everything kept for the client (32 MB), and a result being put together (twice 16 MB)
        assert peak - base < 32 + 2 * 16 + 16, f"the sink grew from {base:.0f} to {peak:.0f} MB"
        assert "--max-unread-mb" in token_level.log
    finally:
        sub.close()
        push.close()


def test_a_reader_that_never_reads_under_protocol_2_costs_the_sink_a_bounded_size(token_level):
    """The same with our clients' options: results come in chunks of 1 MB, and every chunk
    counts against the same budget."""
    identity = b"never-reads"
    sink = sink_pid(token_level)
    base = rss_mb(sink)
    sub = raw_sub(token_level, identity + b"\0", options={zmq.RCVHWM: 1, zmq.RCVBUF: 64 << 10})
    push = raw_push(token_level, {zmq.SNDHWM: 0})
    payload = json.dumps(LONG_TEXTS).encode()
    try:
        with token_level.client(timeout=30) as client:
            abandoned = client.server_status["requests"]["abandoned"]
            for req_id in range(12):
                push.send_multipart([identity, payload, b"%d" % req_id, b"%d" % len(LONG_TEXTS), b'{"v": 2}'])
            wait_for(lambda: client.server_status["requests"]["abandoned"] > abandoned, timeout=120)
            settled_status(client, timeout=120)
        peak_growth = rss_mb(sink, peak=True) - base
        assert peak_growth < 32 + 2 * 16 + 16, f"the sink grew by {peak_growth:.0f} MB"
    finally:
        sub.close()
        push.close()


def test_a_slow_reader_past_its_budget_is_told_why_its_result_was_dropped(token_level):
    """A client that stops reading while its results pile up past --max-unread-mb gets, once it
    reads again, the results kept for it and an error for each one dropped."""
    identity = b"reads-late"
    sub = raw_sub(token_level, identity + b"\0", options={zmq.RCVHWM: 1, zmq.RCVBUF: 64 << 10})
    push = raw_push(token_level, {zmq.SNDHWM: 0})
    payload = json.dumps(LONG_TEXTS[:1000]).encode()  # 8 MB each: four fit
    try:
        for req_id in range(8):
            push.send_multipart([identity, payload, b"%d" % req_id, b"1000", b'{"v": 2}'])
        with token_level.client(timeout=30) as client:
            wait_for(lambda: client.server_status["in_flight_requests"] == 0, timeout=120)
        outcomes = {}
        while len(outcomes) < 8 and sub.poll(10_000):
            frames = sub.recv_multipart()
            header = json.loads(frames[1])
            outcomes.setdefault(int(frames[-1]), header.get("error") or "result")
    finally:
        sub.close()
        push.close()
    assert sorted(outcomes) == list(range(8)), outcomes  # every request answered
    errors = [outcome for outcome in outcomes.values() if outcome != "result"]
    assert 1 <= len(errors) <= 6 and all("unread" in error for error in errors), outcomes
