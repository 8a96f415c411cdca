"""Random and mutated frames at the public request port, for a bounded time: no process dies,
no worker restarts, and a correct request still gets the right answer."""
import json
import time

import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import random_texts, running_server

pytestmark = pytest.mark.timeout(300)
FUZZ_SECONDS = 20  # hypothesis stops at max_examples or here, whichever comes first

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
        pusher = zmq.Context.instance().socket(zmq.PUSH)
        pusher.setsockopt(zmq.LINGER, 0)
        pusher.setsockopt(zmq.SNDTIMEO, 1000)
        pusher.connect(f"tcp://127.0.0.1:{server.port}")
        stop_at = time.monotonic() + FUZZ_SECONDS

        @settings(max_examples=4000, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.one_of(random_frames, mutated_requests()))
        def send(frames):
            if time.monotonic() < stop_at:
                pusher.send_multipart(frames)

        send()
        pusher.close()
        assert server.process.poll() is None
        with server.client() as client:
            status = client.server_status
            assert status["ready"] and status["worker_restarts"] == 0
            np.testing.assert_allclose(client.encode(texts), expected, rtol=1e-5, atol=1e-6)
