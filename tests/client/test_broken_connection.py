"""Both clients when the request connection breaks with a request in flight: a reply that keeps
arriving (a streamed result, chunk by chunk, as a stopping server's sink sends it after its
ventilator has gone) is taken whole however long it takes, and one that stops coming fails its
request soon after, never a wait forever.

The server here is a script on real sockets: it answers the handshake, takes one encode request,
closes its request port, and publishes that request's result in chunks, some time apart."""
import asyncio
import threading
import time

import numpy as np
import pytest
import zmq

from encoder_client import AsyncEncoderClient, ConnectionLostError, EncoderClient
from encoder_client.protocol import decode_request, encode_data, result_messages
from encoder_client.sockets import LOST_GRACE_S

CHUNKS = 6
CHUNK = 128 << 10  # the chunk size this script sends (a server may send any up to protocol.CHUNK_BYTES)
GAP_S = LOST_GRACE_S * 0.3  # between two chunks: the whole result takes longer than the grace
ROWS = CHUNKS * CHUNK // (32 * 4)  # float32 rows of 32 values, CHUNKS chunks in all
TEXTS = ["a text"] * ROWS


class StoppingServer:
    """Answers SHOW_CONFIG; on the first encode request closes its request port, then publishes
    `chunks` of the result's CHUNKS, GAP_S apart (fewer: the rest never comes)."""

    def __init__(self, chunks=CHUNKS):
        self.chunks = chunks
        self.context = zmq.Context()
        self.requests, self.results = self.context.socket(zmq.PULL), self.context.socket(zmq.PUB)
        self.port = self.requests.bind_to_random_port("tcp://127.0.0.1")
        self.port_out = self.results.bind_to_random_port("tcp://127.0.0.1")
        self.rows = np.random.default_rng(0).standard_normal((ROWS, 32)).astype(np.float32)
        assert len(list(result_messages(b"probe", 1, self.rows, streamed=True, chunk_bytes=CHUNK))) == CHUNKS
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not self.requests.poll(100):
                continue
            request = decode_request(self.requests.recv_multipart())
            if request.command == b"SHOW_CONFIG":
                self.results.send_multipart(encode_data(request.identity, request.req_id, {}))
                continue
            self.requests.close(linger=0)  # the ventilator has gone: the client's request connection breaks
            messages = result_messages(request.identity, request.req_id, self.rows, streamed=True,
                                       chunk_bytes=CHUNK)
            for frames in list(messages)[:self.chunks]:
                time.sleep(GAP_S)
                self.results.send_multipart(frames)
            return

    def close(self):
        self.thread.join(10)
        self.context.destroy(linger=0)


@pytest.fixture
def stopping_server(request):
    server = StoppingServer(getattr(request, "param", CHUNKS))
    yield server
    server.close()


def sync_encode(server):
    with EncoderClient("127.0.0.1", server.port, server.port_out, timeout=30) as client:
        return client.encode(TEXTS)


def async_encode(server):
    async def encode():
        async with AsyncEncoderClient("127.0.0.1", server.port, server.port_out, timeout=30) as client:
            return await client.encode(TEXTS)
    return asyncio.run(encode())


@pytest.mark.parametrize("encode", [sync_encode, async_encode])
def test_a_result_still_arriving_is_taken_whole(stopping_server, encode):
    started = time.monotonic()
    rows = encode(stopping_server)
    assert time.monotonic() - started > LOST_GRACE_S  # the grace alone would have given it up
    np.testing.assert_array_equal(rows, stopping_server.rows)


@pytest.mark.parametrize("stopping_server", [2], indirect=True)
@pytest.mark.parametrize("encode", [sync_encode, async_encode])
def test_a_result_that_stops_coming_fails_soon_after(stopping_server, encode):
    started = time.monotonic()
    with pytest.raises(ConnectionLostError, match="broke"):
        encode(stopping_server)
    assert time.monotonic() - started < 2 * GAP_S + 2 * LOST_GRACE_S + 1
