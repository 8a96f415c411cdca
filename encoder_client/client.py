"""EncoderClient: send texts to the ventilator, receive embeddings from the sink.

One EncoderClient belongs to one thread; use ConcurrentEncoderClient to share across threads.
"""
import itertools
import json
import secrets
import time
import uuid
from collections import deque

import numpy as np
import zmq

from .errors import ServerError
from .protocol import decode_reply, encode_request
from .validation import check_texts

CONNECT_TIMEOUT = 10.0
HANDSHAKE_INTERVAL = 0.25


class EncoderClient:
    """Client of an encoder-server.

    `timeout` is in seconds for every wait on the server; None waits forever, except while
    connecting, which gives up after `timeout` or 10 s and raises TimeoutError.
    """

    def __init__(self, host="localhost", port=5555, port_out=5556, identity=None, timeout=None,
                 output_fmt="ndarray"):
        if output_fmt not in ("ndarray", "list"):
            raise ValueError('output_fmt must be "ndarray" or "list"')
        self.identity = _as_identity(identity)
        self.timeout = timeout
        self.output_fmt = output_fmt
        self.address = f"tcp://{host}:{port}"
        self._context = zmq.Context.instance()
        self._sender = self._socket(zmq.PUSH, f"tcp://{host}:{port}")
        self._receiver = self._socket(zmq.SUB, f"tcp://{host}:{port_out}")
        self._receiver.setsockopt(zmq.SUBSCRIBE, self.identity)
        self._next_req_id = secrets.randbelow(2 ** 40) + 1
        self._pending = {}
        self._arrived = {}
        self._closed = False
        try:
            self._handshake(CONNECT_TIMEOUT if timeout is None else timeout)
        except BaseException:
            self.close()
            raise

    # ----- public API -----

    def encode(self, texts, *, is_tokenized=False, show_tokens=False, blocking=True):
        """Embed `texts`; returns an array with one row per text, or (array, tokens)."""
        req_id = self._submit(texts, is_tokenized, show_tokens)
        if not blocking:
            return None
        return self._result(*self._wait(req_id))

    def fetch(self):
        """Yield (req_id, result) for each request sent with blocking=False, as they arrive."""
        while self._pending:
            reply, show_tokens = self._wait(None)
            yield reply.req_id, self._result(reply, show_tokens)

    def fetch_all(self, sort=True, concat=False):
        """All pending results, in sending order when `sort`; one array when `concat`."""
        results = list(self.fetch())
        if sort:
            results.sort(key=lambda pair: pair[0])
        values = [value for _, value in results]
        if concat and values:
            return _concatenate(values, self.output_fmt)
        return values

    def encode_async(self, batch_iterable, max_num_batch=None, max_in_flight=8, **kwargs):
        """Yield one result per batch, in batch order, keeping up to `max_in_flight` sent ahead."""
        batches = itertools.islice(batch_iterable, max_num_batch)
        in_flight = deque()
        for batch in batches:
            in_flight.append(self._submit(batch, **kwargs))
            if len(in_flight) >= max_in_flight:
                yield self._result(*self._wait(in_flight.popleft()))
        while in_flight:
            yield self._result(*self._wait(in_flight.popleft()))

    def listen(self):
        """Yield (req_id, embeddings) for every result published to this identity, from any sender."""
        while True:
            reply = self._receive(self._deadline(), listening=True)
            if reply.array is not None:
                yield reply.req_id, self._format(reply.array)

    @property
    def server_config(self):
        return self._command(b"SHOW_CONFIG")

    @property
    def server_status(self):
        return self._command(b"SHOW_STATUS")

    def shutdown_server(self):
        """Ask the server to finish in-flight requests and stop; honoured only from loopback."""
        return self._command(b"TERMINATION")

    def close(self):
        if not self._closed:
            self._closed = True
            self._sender.close(linger=0)
            self._receiver.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----- internals -----

    def _socket(self, kind, address):
        sock = self._context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        return sock

    def _handshake(self, timeout):
        """Wait until the server answers on our subscription, so no early reply is lost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            req_id = self._send(b"SHOW_CONFIG", 0)
            try:
                self._wait(req_id, min(deadline, time.monotonic() + HANDSHAKE_INTERVAL))
                return
            except TimeoutError:
                continue
        raise TimeoutError(f"no answer from an encoder-server at {self.address} within {timeout:g}s; "
                           "is it running, and are port and port_out right?")

    def _command(self, command):
        return self._wait(self._send(command, 0))[0].data

    def _submit(self, texts, is_tokenized=False, show_tokens=False):
        check_texts(texts, is_tokenized)
        return self._send(json.dumps(texts).encode(), len(texts),
                          {"is_tokenized": is_tokenized, "show_tokens": show_tokens})

    def _send(self, payload, msg_len, options=None):
        req_id = self._next_req_id
        self._next_req_id += 1
        self._pending[req_id] = bool(options and options.get("show_tokens"))
        self._sender.send_multipart(encode_request(self.identity, req_id, payload, msg_len, options))
        return req_id

    def _wait(self, req_id, deadline=None):
        """(reply, show_tokens) for `req_id`, or for any pending request when None.

        The request stops being pending either way, so a late reply is discarded quietly.
        """
        deadline = self._deadline() if deadline is None else deadline
        try:
            while True:
                wanted = req_id if req_id is not None else next(iter(self._arrived), None)
                if wanted in self._arrived:
                    reply = self._arrived.pop(wanted)
                    break
                reply = self._receive(deadline)
                self._arrived[reply.req_id] = reply
        except TimeoutError:
            self._pending.pop(req_id, None)
            raise
        show_tokens = self._pending.pop(reply.req_id, False)
        if reply.error is not None:
            raise ServerError(reply.error, reply.req_id)
        return reply, show_tokens

    def _receive(self, deadline, listening=False):
        while True:
            wait_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._receiver.poll(wait_ms):
                raise TimeoutError(f"no reply from the encoder-server at {self.address} "
                                   f"within {self.timeout}s")
            frames = self._receiver.recv_multipart()
            if frames[0] != self.identity:
                continue  # SUB matches by prefix; we want our identity exactly
            reply = decode_reply(frames)
            if listening or reply.req_id in self._pending:
                return reply

    def _deadline(self):
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _result(self, reply, show_tokens):
        value = self._format(reply.array)
        return (value, reply.tokens) if show_tokens else value

    def _format(self, array):
        return array.tolist() if self.output_fmt == "list" else array


def _as_identity(identity):
    if identity is None:
        return str(uuid.uuid4()).encode("ascii")
    return identity.encode() if isinstance(identity, str) else bytes(identity)


def _concatenate(values, output_fmt):
    if output_fmt == "list":
        return [row for value in values for row in value]
    return np.concatenate(values, axis=0)
