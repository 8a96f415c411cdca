"""AsyncEncoderClient: the asyncio client, on zmq.asyncio.

Many `encode` calls may run at once on one client: each request waits on a future of its own,
which one reader task resolves by request id. The errors and timeouts are the sync client's.
"""
import asyncio

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from .errors import ConnectionLostError, ServerBusyError, identity_refused, reply_error, with_array
from .keys import as_identity, curve_keys
from .protocol import (DEFAULT_PORT, DEFAULT_PORT_OUT, EncodeResult, ReplyReader, decode_reply, encode_request,
                       refusal_topic, reply_req_id, topic)
from .rerank import check_rerank, ranked
from .request import (CONNECT_TIMEOUT, HANDSHAKE_INTERVAL, max_request_bytes, new_req_id, prepare_encode,
                      retry_pause)
from .sockets import AUTH_FAILED, LOST_GRACE_S, break_monitors, client_socket

LISTEN_QUEUE = 1000  # results a slow `listen()` loop may fall behind by before the oldest are dropped


class AsyncEncoderClient:
    """Client of an encoder-server for asyncio code.

    ``async with AsyncEncoderClient(...) as client: vectors = await client.encode(texts)``.
    `timeout` (seconds, None waits forever) bounds every wait on the server and travels with each
    request as its deadline; connecting gives up after `timeout` or 10 s, and raises
    IdentityRefusedError for an identity the server refuses. Keys as EncoderClient.
    """

    def __init__(self, host="localhost", port=DEFAULT_PORT, port_out=DEFAULT_PORT_OUT, identity=None, timeout=None,
                 server_key=None, client_key=None):
        self.identity = as_identity(identity)
        self._topic, self._refusal_topic = topic(self.identity), refusal_topic(self.identity)
        self.timeout = timeout
        self.address = f"tcp://{host}:{port}"
        self._curve = curve_keys(server_key, client_key)
        self._context = zmq.asyncio.Context.instance()
        self._sender = self._socket(zmq.PUSH, f"tcp://{host}:{port}")
        self._receiver = self._socket(zmq.SUB, f"tcp://{host}:{port_out}")
        self._receiver.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._monitors = break_monitors(self._sender, self._receiver)
        self._connected = False
        self._refusal = None    # the server's refusal of our identity, while connecting
        self._waiting = {}      # req_id -> future of its Reply
        self._chunk_at = {}     # req_id of a request waiting -> when the last chunk of its streamed result came
        self._replies = ReplyReader()
        self._listeners = set()
        self._tasks = []
        self._max_request_bytes = None
        self._closed = False

    async def connect(self):
        """Start reading and wait until the server answers on our subscription (no early reply is
        lost); raises TimeoutError when no server answers in time."""
        if not self._tasks:
            self._tasks = [asyncio.ensure_future(self._read_replies()),
                           *(asyncio.ensure_future(self._watch_connection(monitor)) for monitor in self._monitors)]
        timeout = CONNECT_TIMEOUT if self.timeout is None else self.timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            try:
                config = await self._command(b"SHOW_CONFIG", min(HANDSHAKE_INTERVAL, deadline - loop.time()))
            except (TimeoutError, ConnectionLostError):
                if self._closed:
                    raise  # closed meanwhile (by another task): nothing to wait for, and retrying would spin
                continue
            self._max_request_bytes = max_request_bytes(config)
            self._connected = True
            return self
        raise TimeoutError(f"no answer from an encoder-server at {self.address} within {timeout:g}s; "
                           "is it running, and are port and port_out right?")

    async def encode(self, texts, *, is_tokenized=False, show_tokens=False, retries=0, **model_options):
        """Embed `texts`: an array with one row per text, or (array, tokens) with show_tokens.
        `model_options` as EncoderClient.encode: prompt, prompt_name, normalize, truncate, long_texts,
        dimensions, precision, model."""
        result = await self.encode_result(texts, is_tokenized=is_tokenized, show_tokens=show_tokens,
                                          retries=retries, **model_options)
        return (result.embeddings, result.tokens) if show_tokens else result.embeddings

    async def encode_result(self, texts, *, is_tokenized=False, show_tokens=False, retries=0, **model_options):
        """Embed `texts`; an EncodeResult with the server's token count. `retries` as EncoderClient."""
        request = prepare_encode(texts, is_tokenized, show_tokens, self.timeout, self._max_request_bytes,
                                 **model_options)
        for attempt in range(retries + 1):
            try:
                reply = await self._request(*request)
                return EncodeResult.of(with_array(reply))
            except (TimeoutError, ConnectionLostError, ServerBusyError):
                if attempt == retries:
                    raise
                await asyncio.sleep(retry_pause(attempt))

    async def rerank(self, query, documents, *, top_n=None, return_documents=False, model=None, raw_scores=False,
                     truncate=None, retries=0):
        """Score each document against `query`, best first: as EncoderClient.rerank."""
        check_rerank(query, documents, top_n)
        result = await self.encode_result(documents, retries=retries, query=query, model=model,
                                          raw_scores=raw_scores or None, truncate=truncate)
        return ranked(result.embeddings[:, 0], top_n, documents if return_documents else None)

    async def listen(self):
        """Yield (req_id, embeddings) for every result published to this identity, from any sender."""
        queue = asyncio.Queue(LISTEN_QUEUE)
        self._listeners.add(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._listeners.discard(queue)

    async def server_config(self):
        return await self._command(b"SHOW_CONFIG")

    async def server_status(self):
        return await self._command(b"SHOW_STATUS")

    async def shutdown_server(self):
        """Ask the server to finish in-flight requests and stop; honoured only from loopback."""
        return await self._command(b"TERMINATION")

    def close(self):
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionLostError("the client was closed"))
        for sock in (self._sender, self._receiver):
            sock.disable_monitor()
        for sock in (*self._monitors, self._sender, self._receiver):
            sock.close(linger=0)

    async def __aenter__(self):
        try:
            return await self.connect()
        except BaseException:
            self.close()
            raise

    async def __aexit__(self, *exc):
        self.close()

    # ----- internals -----

    def _socket(self, kind, address):
        return client_socket(self._context, kind, address, self._curve)

    async def _command(self, command, timeout=None):
        return (await self._request(command, 0, None, timeout)).data

    async def _request(self, payload, msg_len, options, timeout=None):
        """Send one request and wait for its reply (an error reply raises)."""
        if self._closed:
            raise ConnectionLostError("the client is closed")
        if self._refusal is not None:
            raise self._refusal
        if not self._tasks:
            await self.connect()
        timeout = self.timeout if timeout is None else timeout
        req_id = new_req_id()
        future = self._waiting[req_id] = asyncio.get_running_loop().create_future()
        try:
            frames = encode_request(self.identity, req_id, payload, msg_len, options)
            # asyncio.timeout, not wait_for: before Python 3.12 wait_for can drop the caller's cancellation
            async with asyncio.timeout(timeout):
                await self._sender.send_multipart(frames)
            async with asyncio.timeout(timeout):
                reply = await future
        except TimeoutError:
            raise TimeoutError(f"no reply from the encoder-server at {self.address} within {timeout}s") from None
        finally:
            self._waiting.pop(req_id, None)  # a late reply is then discarded
            self._chunk_at.pop(req_id, None)
        if reply.error is not None:
            raise reply_error(reply)
        return reply

    async def _read_replies(self):
        while True:
            frames = await self._receiver.recv_multipart()
            if frames[0] == self._refusal_topic and not self._connected:
                self._refusal = identity_refused(self.address, decode_reply(frames))
                self._fail_waiting(self._refusal)
            if frames[0] != self._topic:
                continue  # a refusal of another subscriber of our identity: not ours
            reply = self._replies.read(frames)
            if reply is None:  # more of a streamed result is to come
                req_id = reply_req_id(frames)
                if req_id in self._waiting:
                    self._chunk_at[req_id] = asyncio.get_running_loop().time()
                continue
            future = self._waiting.get(reply.req_id)
            if future is not None and not future.done():
                future.set_result(reply)
            if reply.array is not None:
                for queue in self._listeners:
                    if queue.full():
                        queue.get_nowait()
                    queue.put_nowait((reply.req_id, reply.array))

    async def _watch_connection(self, monitor):
        """A broken connection fails every request in flight at once; a refused key, every one."""
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())["event"]
            if event & AUTH_FAILED:
                error = PermissionError(f"the encoder-server at {self.address} refused this client's "
                                        "CURVE key (or the server key is wrong)")
            else:
                error = ConnectionLostError(f"the connection to the encoder-server at {self.address} broke "
                                            "with requests in flight; their replies may never come")
            waiting = dict(self._waiting)
            if not event & AUTH_FAILED:
                waiting = await self._stopped_arriving(waiting)
            self._fail_waiting(error, waiting.values())

    async def _stopped_arriving(self, waiting):
        """Those of the requests `waiting` ({req_id: future}) whose replies did not come: replies
        already on their way still arrive, each within LOST_GRACE_S, or LOST_GRACE_S after the
        last chunk of its streamed result."""
        loop = asyncio.get_running_loop()
        stopped = {}
        while waiting:
            await asyncio.sleep(LOST_GRACE_S)
            now = loop.time()
            for req_id, future in list(waiting.items()):
                last_chunk = self._chunk_at.get(req_id)
                if future.done():
                    del waiting[req_id]
                elif last_chunk is None or now - last_chunk >= LOST_GRACE_S:
                    stopped[req_id] = waiting.pop(req_id)
        return stopped

    def _fail_waiting(self, error, waiting=None):
        for future in self._waiting.values() if waiting is None else waiting:
            if not future.done():
                future.set_exception(error)
