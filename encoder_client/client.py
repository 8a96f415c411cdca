"""EncoderClient: send texts to the ventilator, receive embeddings from the sink.

One EncoderClient belongs to one thread; use ConcurrentEncoderClient to share across threads.
"""
import itertools
import time
from collections import deque

import numpy as np
import zmq

from .errors import ConnectionLostError, ServerBusyError, identity_refused, reply_error, with_array
from .keys import as_identity, curve_keys
from .progress import PROGRESS_CHUNK, chunks, progress_bar
from .protocol import (DEFAULT_PORT, DEFAULT_PORT_OUT, EncodeResult, ReplyReader, decode_reply, encode_request,
                       refusal_topic, reply_req_id, topic)
from .rerank import check_rerank, ranked
from .request import (CONNECT_TIMEOUT, HANDSHAKE_INTERVAL, announced, max_request_bytes, new_req_id,
                      prepare_encode, retry_pause)
from .sparse import SparseVectors
from .sockets import AUTH_FAILED, LOST_GRACE_S, break_monitors, client_socket, monitor_event, readable, send_frames
from .validation import check_texts


class EncoderClient:
    """Client of an encoder-server.

    `timeout` is in seconds for every wait on the server; None waits forever, except while
    connecting, which gives up after `timeout` or 10 s and raises TimeoutError. The server drops
    work still queued when the timeout has passed. An `identity` the server refuses (under CURVE,
    one another client key uses) raises IdentityRefusedError while connecting.

    With a server started with --server-key, pass its public key file as `server_key` and this
    client's .key_secret file as `client_key` (from `encoder-server keygen`).
    """

    def __init__(self, host="localhost", port=DEFAULT_PORT, port_out=DEFAULT_PORT_OUT, identity=None, timeout=None,
                 output_fmt="ndarray", server_key=None, client_key=None):
        if output_fmt not in ("ndarray", "list"):
            raise ValueError('output_fmt must be "ndarray" or "list"')
        self.identity = as_identity(identity)
        self._topic, self._refusal_topic = topic(self.identity), refusal_topic(self.identity)
        self.timeout = timeout
        self.output_fmt = output_fmt
        self.address = f"tcp://{host}:{port}"
        self._context = zmq.Context.instance()
        self._curve = curve_keys(server_key, client_key)
        self._sender = self._socket(zmq.PUSH, f"tcp://{host}:{port}")
        self._receiver = self._socket(zmq.SUB, f"tcp://{host}:{port_out}")
        self._receiver.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._monitors = break_monitors(self._sender, self._receiver)
        self._poller = zmq.Poller()  # a reply, or news of a broken connection
        for sock in (self._receiver, *self._monitors):
            self._poller.register(sock, zmq.POLLIN)
        self._connected = False
        self._pending = {}
        self._replies = ReplyReader()
        self._arrived = {}
        self._lost = {}  # request in flight when the connection broke -> when it counts as lost
        self._max_request_bytes = None
        self._max_pending_texts = None
        self._closed = False
        try:
            self._handshake(CONNECT_TIMEOUT if timeout is None else timeout)
        except BaseException:
            self.close()
            raise

    # ----- public API -----

    def encode(self, texts, *, is_tokenized=False, show_tokens=False, blocking=True, retries=0,
               show_progress=False, prompt=None, prompt_name=None, normalize=None, truncate=None, model=None,
               long_texts=None, dimensions=None, precision=None, top_k=None):
        """Embed `texts`; returns an array with one row per text, or (array, tokens).

        `model` names one of the server's models (None: its default one, the first it serves).

        As in sentence-transformers: `prompt` is prepended to each text, or `prompt_name` names one
        of the model's prompts (default: the server's default prompt); `normalize` overrides the
        model's L2 normalization.

        `long_texts` says what a text longer than the server's max_seq_len becomes (None: as the
        server's --long-texts says): "truncate", "error" (the request fails with ServerError, code
        "too_large"; `truncate=False` says the same) or "chunk" (embedded whole: the token-weighted
        mean of its windows; `encode_result` tells how many each text took).

        `dimensions` keeps each vector's first values (Matryoshka; renormalized when normalizing),
        and `precision` is the type served, as in sentence-transformers' quantize_embeddings:
        "float32" (default), "float16", "int8" and "uint8" (in the ranges that server_config's
        `calibration` publishes), "binary" and "ubinary" (one bit per dimension, packed).

        A sparse model (SPLADE) gives a SparseVectors (encoder_client.sparse: indices, values and
        offsets of each row's non-zero entries, `to_scipy()`), each row cut to its `top_k` largest
        entries when asked; with show_tokens, the tokens are each row's vocabulary entries.

        With `retries`, a request that timed out, lost its connection or found the server busy is
        sent again (each try waits up to `timeout`); a late reply to an earlier try is discarded.
        With `show_progress`, a long list is sent as pipelined sub-requests under a tqdm bar.
        """
        options = dict(prompt=prompt, prompt_name=prompt_name, normalize=normalize, truncate=truncate, model=model,
                       long_texts=long_texts, dimensions=dimensions, precision=precision, top_k=top_k)
        if show_progress:
            if not blocking:
                raise ValueError("show_progress needs blocking=True")
            return self._encode_pipelined(texts, is_tokenized, show_tokens, retries, options)
        if not blocking:
            self._submit(texts, is_tokenized, show_tokens, options)
            return None
        return self._result(*self._call(texts, options, retries, is_tokenized, show_tokens))

    def encode_result(self, texts, *, is_tokenized=False, show_tokens=False, retries=0, **model_options):
        """Embed `texts`; an EncodeResult: the array, and what the server says of it (tokens computed,
        texts truncated, windows per text). `model_options` as `encode` takes them."""
        reply, _ = self._call(texts, model_options, retries, is_tokenized, show_tokens)
        return EncodeResult.of(with_array(reply))

    def rerank(self, query, documents, *, top_n=None, return_documents=False, model=None, raw_scores=False,
               truncate=None, retries=0):
        """Score each document against `query` with a cross-encoder the server serves (`model`: its
        name; None: the first reranker it serves). Returns (index, score) pairs,
        best first, the first `top_n` of them; with `return_documents`, (index, score, document).
        Scores are as sentence-transformers' CrossEncoder.predict gives them (the model's activation),
        or the raw logits with `raw_scores`. A pair longer than the model's max_seq_len loses the end
        of its document (with `truncate=False` it fails the request instead); a query too long to
        leave room for any document fails it (ServerError). `retries` as encode."""
        check_rerank(query, documents, top_n)
        options = dict(query=query, model=model, raw_scores=raw_scores or None, truncate=truncate)
        reply, _ = self._call(documents, options, retries)
        return ranked(with_array(reply).array[:, 0], top_n, documents if return_documents else None)

    def _call(self, texts, options, retries, is_tokenized=False, show_tokens=False):
        """Send one request and wait for its reply, (Reply, show_tokens); sent again on a timeout, a
        lost connection or a busy server while `retries` last."""
        for attempt in range(retries + 1):
            req_id = self._submit(texts, is_tokenized, show_tokens, options)
            try:
                return self._wait(req_id)
            except (TimeoutError, ConnectionLostError, ServerBusyError):
                if attempt == retries:
                    raise
                time.sleep(retry_pause(attempt))

    def fetch(self):
        """Yield (req_id, result) for each request sent with blocking=False, as they arrive."""
        while self._pending:
            reply, show_tokens = self._wait(None)
            yield reply.req_id, self._result(reply, show_tokens)

    def fetch_all(self, sort=True, concat=False):
        """All pending results, in sending order when `sort`; one array when `concat`."""
        sent_order = {req_id: position for position, req_id in enumerate(self._pending)}
        results = list(self.fetch())
        if sort:
            results.sort(key=lambda pair: sent_order[pair[0]])
        values = [value for _, value in results]
        if concat and values:
            return _concatenate(values, self.output_fmt)
        return values

    def encode_async(self, batch_iterable, max_num_batch=None, max_in_flight=8, **kwargs):
        """Yield one result per batch, in batch order, keeping up to `max_in_flight` sent ahead."""
        batches = itertools.islice(batch_iterable, max_num_batch)
        is_tokenized, show_tokens = kwargs.pop("is_tokenized", False), kwargs.pop("show_tokens", False)
        in_flight = deque()
        for batch in batches:
            in_flight.append(self._submit(batch, is_tokenized, show_tokens, kwargs))
            if len(in_flight) >= max_in_flight:
                yield self._result(*self._wait(in_flight.popleft()))
        while in_flight:
            yield self._result(*self._wait(in_flight.popleft()))

    def _encode_pipelined(self, texts, is_tokenized, show_tokens, retries, options, max_in_flight=4):
        """Send `texts` as sub-requests, `max_in_flight` ahead, so the server never waits for us.
        A sub-request that times out, loses its connection or finds the server busy is sent again
        (at the back of the line) while `retries` last."""
        check_texts(texts, is_tokenized)
        pieces = chunks(texts, min(PROGRESS_CHUNK, self._max_pending_texts or PROGRESS_CHUNK))
        results, attempts = [None] * len(pieces), [0] * len(pieces)
        unsent, in_flight = deque(range(len(pieces))), deque()
        with progress_bar(len(texts)) as bar:
            while unsent or in_flight:
                while unsent and len(in_flight) < max_in_flight:
                    index = unsent.popleft()
                    in_flight.append((index, self._submit(pieces[index], is_tokenized, show_tokens, options)))
                index, req_id = in_flight.popleft()
                try:
                    results[index] = self._result(*self._wait(req_id))
                    bar.update(len(pieces[index]))
                except (TimeoutError, ConnectionLostError, ServerBusyError):
                    if attempts[index] == retries:
                        raise
                    time.sleep(retry_pause(attempts[index]))
                    attempts[index] += 1
                    unsent.append(index)
        if show_tokens:
            return _concatenate([r[0] for r in results], self.output_fmt), [t for r in results for t in r[1]]
        return _concatenate(results, self.output_fmt)

    def listen(self):
        """Yield (req_id, embeddings) for every result published to this identity, from any sender."""
        while True:
            reply = self._receive(self._deadline(), listening=True)
            if reply is not None and reply.array is not None:
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
            for sock in (self._sender, self._receiver):
                sock.disable_monitor()
            for sock in (*self._monitors, self._sender, self._receiver):
                sock.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----- internals -----

    def _socket(self, kind, address):
        send_timeout = {} if self.timeout is None else {zmq.SNDTIMEO: max(1, int(self.timeout * 1000))}
        return client_socket(self._context, kind, address, self._curve, send_timeout)

    def _handshake(self, timeout):
        """Wait until the server answers on our subscription, so no early reply is lost."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            req_id = self._send(b"SHOW_CONFIG", 0)
            try:
                config = self._wait(req_id, min(deadline, time.monotonic() + HANDSHAKE_INTERVAL))[0].data
            except (TimeoutError, ConnectionLostError):
                continue
            self._max_request_bytes = max_request_bytes(config)
            self._max_pending_texts = announced(config, "max_pending_texts")
            self._connected = True
            return
        raise TimeoutError(f"no answer from an encoder-server at {self.address} within {timeout:g}s; "
                           "is it running, and are port and port_out right?")

    def _command(self, command):
        return self._wait(self._send(command, 0))[0].data

    def _submit(self, texts, is_tokenized=False, show_tokens=False, options=None):
        return self._send(*prepare_encode(texts, is_tokenized, show_tokens, self.timeout, self._max_request_bytes,
                                          **(options or {})))

    def _send(self, payload, msg_len, options=None):
        req_id = new_req_id()
        self._check_connection()  # a break before this request is not its concern
        try:
            send_frames(self._sender, encode_request(self.identity, req_id, payload, msg_len, options))
        except zmq.Again:
            raise TimeoutError(f"the encoder-server at {self.address} did not take the request "
                               f"within {self.timeout}s") from None
        self._pending[req_id] = bool(options and options.get("show_tokens"))
        return req_id

    def _check_connection(self):
        """Read connection events: a break marks the requests in flight as lost."""
        for monitor in self._monitors:
            while readable(monitor):
                if monitor_event(monitor) & AUTH_FAILED:
                    raise PermissionError(f"the encoder-server at {self.address} refused this client's "
                                          "CURVE key (or the server key is wrong)")
                lost_at = time.monotonic() + LOST_GRACE_S
                for req_id in self._pending:
                    self._lost.setdefault(req_id, lost_at)

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
                self._raise_if_lost(req_id)
                wake_at = self._wake_at(deadline)
                try:
                    reply = self._receive(wake_at)
                except TimeoutError:
                    if wake_at is deadline:
                        raise
                    continue  # a request marked lost is due: the loop raises for it
                if reply is not None:
                    self._arrived[reply.req_id] = reply
        except (TimeoutError, ConnectionLostError):
            self._pending.pop(req_id, None)
            self._lost.pop(req_id, None)
            raise
        show_tokens = self._pending.pop(reply.req_id, False)
        self._lost.pop(reply.req_id, None)
        if reply.error is not None:
            raise reply_error(reply)
        return reply, show_tokens

    def _wake_at(self, deadline):
        """The caller's deadline, or sooner when a request marked lost is due to count as lost."""
        due = min(self._lost.values(), default=None)
        return deadline if due is None or (deadline is not None and deadline <= due) else due

    def _raise_if_lost(self, req_id):
        now = time.monotonic()
        lost = {lost for lost, due in self._lost.items() if due <= now}
        lost &= {req_id} if req_id is not None else set(self._pending)
        if lost:
            first = min(lost)
            self._lost.pop(first)
            self._pending.pop(first, None)
            raise ConnectionLostError(f"the connection to the encoder-server at {self.address} broke while "
                                      f"request {first} was in flight; its reply may never come")

    def _receive(self, deadline, listening=False):
        while True:
            wait_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            events = dict(self._poller.poll(wait_ms))
            if not events:
                raise TimeoutError(f"no reply from the encoder-server at {self.address} "
                                   f"within {self.timeout}s")
            if self._receiver not in events:
                self._check_connection()
                return None
            frames = self._receiver.recv_multipart()
            if frames[0] == self._refusal_topic and not self._connected:
                raise identity_refused(self.address, decode_reply(frames))
            if frames[0] != self._topic:
                continue  # a refusal of another subscriber of our identity: not ours
            reply = self._replies.read(frames)
            if reply is None:
                self._arriving(reply_req_id(frames))
            elif listening or reply.req_id in self._pending:
                return reply

    def _arriving(self, req_id):
        """A chunk of `req_id`'s result came: after a break, its reply is still on its way, and the
        request counts as lost only LOST_GRACE_S after its last chunk."""
        if req_id in self._lost:
            self._lost[req_id] = time.monotonic() + LOST_GRACE_S

    def _deadline(self):
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _result(self, reply, show_tokens):
        value = self._format(with_array(reply).array)
        return (value, reply.tokens) if show_tokens else value

    def _format(self, array):
        """An array as output_fmt says (a sparse model's SparseVectors stay as they are)."""
        return array.tolist() if self.output_fmt == "list" and isinstance(array, np.ndarray) else array


def _concatenate(values, output_fmt):
    if isinstance(values[0], SparseVectors):
        return SparseVectors.concat(values)
    if output_fmt == "list":
        return [row for value in values for row in value]
    return np.concatenate(values, axis=0)
