"""Both clients against a server that publishes replies no encoder-server would (the wrong program
on the port, a broken or hostile server): each such reply fails its own request with a ServerError
that names the problem, at once, and the client goes on serving; one it cannot place is dropped.
A chunked result's header claims its size before its bytes come, so the claim alone costs the
client no memory; limits in a SHOW_CONFIG reply that are no positive integers are ignored.

The server here is a script on real sockets: it answers the handshake, then each encode request
with the frames its test gives (the request's topic and req_id filled in)."""
import asyncio
import json
import os
import threading
import time

import numpy as np
import pytest
import zmq

from encoder_client import AsyncEncoderClient, EncoderClient, ServerError
from encoder_client.protocol import ReplyReader, decode_request, encode_data, result_messages, topic

pytestmark = pytest.mark.timeout(60)
TOPIC, REQ_ID = object(), object()  # stand-ins for the request's own
ROW = np.arange(4, dtype=np.float32)


def result(header, body=ROW.tobytes()):
    return [TOPIC, json.dumps(header).encode(), body, REQ_ID]


MALFORMED = {
    "a header that is not JSON": ([TOPIC, b"{", b"", REQ_ID], "not JSON"),
    "a header that is a list": (result([1, 2]), "not a JSON object"),
    "no dtype": (result({"shape": [1, 4]}), "'dtype'"),
    "an unknown dtype": (result({"dtype": "complex-ish", "shape": [1, 4]}), "dtype 'complex-ish'"),
    "a shape its bytes do not fill": (result({"dtype": "float32", "shape": [2, 4]}), "shape"),
    "a shape of strings": (result({"dtype": "float32", "shape": ["1", "4"]}), "shape"),
    "sparse fields that are not an object": (result({"dtype": "uint8", "shape": [16], "sparse": "x"}), "sparse"),
    "a chunk before its result": (result({"dtype": "float32", "shape": [1, 8], "offset": -16}), "offset -16"),
    "a chunk past its result": (result({"dtype": "float32", "shape": [1, 8], "offset": 24}), "offset 24"),
    "an offset that is no number": (result({"dtype": "float32", "shape": [1, 8], "offset": "0"}), "offset '0'"),
    "a result of a petabyte": (result({"dtype": "float32", "shape": [2 ** 48, 4], "offset": 0}), "bytes"),
    "a result of more bytes than numpy can count": (result({"dtype": "float32", "shape": [2 ** 62, 4],
                                                           "offset": 0}), "bytes"),
    "two frames": ([TOPIC, REQ_ID], "frames"),
    "five frames": ([TOPIC, b"{}", b"", b"", REQ_ID], "frames"),
    "a data reply to an encode request": ([TOPIC, b"{}", REQ_ID], "no array"),
}


class ScriptedServer:
    """Answers SHOW_CONFIG with `config`; answers the first encode request with `first` (a list of
    frames, or of lists of frames sent in turn; None: the right rows too) and every later one with
    the right rows."""

    def __init__(self, first, config=None):
        self.first, self.config = first, {} if config is None else config
        self.context = zmq.Context()
        self.requests, self.results = self.context.socket(zmq.PULL), self.context.socket(zmq.PUB)
        self.port = self.requests.bind_to_random_port("tcp://127.0.0.1")
        self.port_out = self.results.bind_to_random_port("tcp://127.0.0.1")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        answered = False
        while not self.stop.is_set():
            if not self.requests.poll(50):
                continue
            request = decode_request(self.requests.recv_multipart())
            if request.command == b"SHOW_CONFIG":
                self.results.send_multipart(encode_data(request.identity, request.req_id, self.config))
            elif not answered and self.first is not None:
                answered = True
                for frames in self.first if isinstance(self.first[0], list) else [self.first]:
                    self.results.send_multipart([topic(request.identity) if frame is TOPIC else
                                                 b"%d" % request.req_id if frame is REQ_ID else frame
                                                 for frame in frames])
            else:
                rows = np.tile(ROW, (len(json.loads(request.payload)), 1))
                self.results.send_multipart(next(result_messages(request.identity, request.req_id, rows)))

    def close(self):
        self.stop.set()
        self.thread.join(10)
        self.context.destroy(linger=0)


def sync_encodes(server, count=2):
    """What `count` encodes in turn on one client give: arrays, or the exceptions they raised."""
    outcomes = []
    with EncoderClient("127.0.0.1", server.port, server.port_out, timeout=10) as client:
        for _ in range(count):
            try:
                outcomes.append(client.encode(["a text"]))
            except ServerError as error:
                outcomes.append(error)
    return outcomes


def async_encodes(server, count=2):
    async def encodes():
        outcomes = []
        async with AsyncEncoderClient("127.0.0.1", server.port, server.port_out, timeout=10) as client:
            for _ in range(count):
                try:
                    outcomes.append(await client.encode(["a text"]))
                except ServerError as error:
                    outcomes.append(error)
        return outcomes
    return asyncio.run(encodes())


@pytest.mark.parametrize("encodes", [sync_encodes, async_encodes])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_reply_fails_its_request_with_a_clear_error_and_the_client_goes_on(case, encodes):
    frames, fragment = MALFORMED[case]
    server = ScriptedServer(frames)
    try:
        started = time.monotonic()
        failed, served = encodes(server)
    finally:
        server.close()
    assert isinstance(failed, ServerError) and "cannot read" in str(failed) and fragment in str(failed), failed
    assert time.monotonic() - started < 5  # at once: not at the 10 s timeout
    np.testing.assert_array_equal(served, ROW[None, :])


@pytest.mark.parametrize("encodes", [sync_encodes, async_encodes])
def test_a_reply_whose_request_cannot_be_read_is_dropped_and_the_real_one_still_taken(encodes):
    row = next(result_messages(b"", 0, ROW[None, :]))
    server = ScriptedServer([[TOPIC, b"{", b"", b"not a number"], [TOPIC, b"{}", row[2], b"-5"],
                             [TOPIC, row[1], row[2], REQ_ID]])
    try:
        outcomes = encodes(server, count=1)
    finally:
        server.close()
    np.testing.assert_array_equal(outcomes[0], ROW[None, :])


@pytest.mark.parametrize("config", [[1, 2], "x", {"max_request_mb": "128", "max_pending_texts": -1},
                                    {"max_request_mb": 1.5, "max_pending_texts": True}])
def test_limits_a_server_announces_that_are_no_positive_integers_are_ignored(config):
    server = ScriptedServer(None, config)
    try:
        with EncoderClient("127.0.0.1", server.port, server.port_out, timeout=10) as client:
            shown = client.encode(["a", "b", "c"], show_progress=True)  # in pieces of at most max_pending_texts
            sent = client.encode(["a"])

        async def encode():
            async with AsyncEncoderClient("127.0.0.1", server.port, server.port_out, timeout=10) as client:
                return await client.encode(["a"])
        awaited = asyncio.run(encode())
    finally:
        server.close()
    np.testing.assert_array_equal(shown, np.tile(ROW, (3, 1)))
    for rows in (sent, awaited):
        np.testing.assert_array_equal(rows, ROW[None, :])


def test_a_chunked_claim_takes_no_memory_before_its_bytes_come():
    reader = ReplyReader()
    before = resident_bytes()
    for req_id in range(4):  # 4 claims of 1 GB each, one 16-byte chunk of each
        assert reader.read([b"t\0", json.dumps({"dtype": "float32", "shape": [2 ** 28, 1], "offset": 0}).encode(),
                            ROW.tobytes(), b"%d" % req_id]) is None
    assert len(reader._partial) == 4 and resident_bytes() - before < 64 << 20


def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
