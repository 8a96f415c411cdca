"""The public wire format, shared by the client and the server.

It keeps bert-as-service's frames so its published client works unchanged:

- request: ``[identity, payload, req_id, msg_len]`` plus an optional ``options`` JSON frame
  (our extension), where ``payload`` is a JSON list of texts (or of word lists) or a command;
  an identity is at most MAX_IDENTITY_BYTES bytes and holds no NUL byte;
- every reply goes out under the client's topic, ``topic(identity)``: the identity and a NUL byte,
  so that a subscription to one topic matches that one identity and no other;
- result: ``[topic, header, body, req_id]`` with ``header = {"dtype", "shape", "tokens",
  "num_tokens", "truncated"}`` (ours: ``num_tokens``, the request's token count after truncation,
  special tokens included; ``truncated``, how many of its texts were cut at max_seq_len; with
  long_texts=chunk, ``windows``: per text, the windows it was embedded in) and ``body`` the raw
  array bytes, of ``dtype`` (float32, or the precision asked: float16, int8, uint8); a sparse
  model's rows are SparseVectors' wire form (encoder_client.sparse) as uint8 bytes, the header's
  ``sparse`` giving their ``rows``, ``nnz`` and ``dim``;
- error: ``[topic, {"error": message, "code": code}, b"", req_id]``, where ``code`` (ours, may
  be absent) says what kind of refusal it is, one of ERROR_CODES;
- reply to a command: ``[topic, json, req_id]``;
- a refused subscription: an error under ``refusal_topic(identity)``, which only the refused
  subscriber (and the identity's own subscribers, who ignore it) receives.

bert-serving-client (protocol 1) ignores the topic frame: its subscription to its bare identity,
a UUID, is applied by the server as that identity's topic.

Protocol 2 (clients that send ``"v": 2`` in their options): a result larger than a chunk (at
most CHUNK_BYTES; the server may choose less) comes as one result message per chunk of its body,
each header adding ``"offset"``, where its bytes go in the array (``tokens`` only in the first). A
server's queue for a reader then holds messages of bounded size, and the client puts them back
together (ReplyReader), whatever their size.
"""
import functools
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .json_frames import from_json, to_json
from .sparse import SparseVectors

PROTOCOL_VERSION = 2
DEFAULT_PORT, DEFAULT_PORT_OUT = 5555, 5556  # the server's request and result ports
DEFAULT_MAX_REQUEST_MB = 128  # the largest request a server takes unless --max-request-mb says otherwise
TOKEN_LEVEL = "none"  # the pooling strategy whose results are [n, seq, dim]: one vector per token
STREAMED_SINCE = 2  # the protocol version from which clients take results in chunks
# each chunk is a message of its own, which costs its reader a wake-up: 256 rows of 1,024 float32
# values go in one (with chunks of 128 KB, a client sending 256 short texts at a time to the zero
# backend on 2 cores spent 13-35% more CPU a request, and the sink 14-50% more)
CHUNK_BYTES = 1 << 20
COMMANDS = (b"SHOW_CONFIG", b"SHOW_STATUS", b"TERMINATION")
MAX_IDENTITY_BYTES = 256
TOPIC_END = b"\0"  # ends every topic on the result port; no identity holds it
REFUSED = b"\x01"  # after a topic: the server refused a subscription to it
UNKNOWN_REQ_ID = -1
MAX_FRAME_INT = 2 ** 64 - 1  # req_id and msg_len

# what an error reply's "code" says, and what a client may do about it
BUSY = "busy"                # the server is full: retry later (HTTP's 429)
TOO_LARGE = "too_large"      # more texts than the server ever holds at once: split the request (413)
BAD_REQUEST = "bad_request"  # malformed frames or invalid texts: resending the same fails again (400)
DRAINING = "draining"        # the server is shutting down: retry against its successor (503)
FORBIDDEN = "forbidden"      # a command, or an identity, this peer may not use (403)
RESTARTED = "restarted"      # a process of the server died and was restarted mid-request: resend it (503)
NOT_FOUND = "not_found"      # the request names a model the server does not serve (404)
ERROR_CODES = (BUSY, TOO_LARGE, BAD_REQUEST, DRAINING, FORBIDDEN, RESTARTED, NOT_FOUND)


class ProtocolError(ValueError):
    """A frame set that does not follow the protocol; `identity` is set when it could be read."""

    def __init__(self, message, identity=None, req_id=UNKNOWN_REQ_ID, code=BAD_REQUEST):
        super().__init__(message)
        self.identity = identity
        self.req_id = req_id
        self.code = code


@dataclass(frozen=True)
class Request:
    identity: bytes
    req_id: int
    payload: bytes
    msg_len: int
    options: dict = field(default_factory=dict)

    @property
    def command(self):
        return self.payload if self.payload in COMMANDS else None


@dataclass(frozen=True)
class Reply:
    """One message published to a client: exactly one of array, data and error is set."""
    req_id: int
    array: np.ndarray = None
    tokens: list = None
    data: dict = None
    error: str = None
    code: str = None
    num_tokens: int = None
    truncated: int = 0
    windows: list = None  # per text, the windows a long text was cut into (long_texts=chunk)


@dataclass(frozen=True)
class EncodeResult:
    """A result with what the server says of it."""
    embeddings: np.ndarray  # float32, or the precision asked for
    num_tokens: int         # tokens the server computed, [CLS]/[SEP] included, after truncation
    tokens: list = None     # WordPiece tokens per text, when asked for with show_tokens
    truncated: int = 0      # how many texts were cut at the server's max_seq_len
    windows: list = None    # with long_texts="chunk": per text, the windows it was embedded in

    @classmethod
    def of(cls, reply):
        return cls(reply.array, reply.num_tokens, reply.tokens, reply.truncated, reply.windows)


def check_identity(identity):
    """`identity` as bytes (a str is UTF-8 encoded); ValueError naming what is wrong with it."""
    identity = identity.encode() if isinstance(identity, str) else bytes(identity)
    if len(identity) > MAX_IDENTITY_BYTES:
        raise ValueError(f"a client identity is at most {MAX_IDENTITY_BYTES} bytes, got {len(identity)}")
    if TOPIC_END in identity:
        raise ValueError("a client identity may not hold a NUL byte (it ends the identity's topic)")
    return identity


def topic(identity):
    """What the result port publishes `identity`'s replies under, and its clients subscribe to."""
    return identity + TOPIC_END


def refusal_topic(identity):
    """Where the server says why it refused a subscription to `identity`'s topic."""
    return topic(identity) + REFUSED


def encode_request(identity, req_id, payload, msg_len=0, options=None):
    frames = [identity, payload, b"%d" % req_id, b"%d" % msg_len]
    if options:
        frames.append(json.dumps({"v": PROTOCOL_VERSION, **options}).encode())
    return frames


def decode_request(frames):
    """Parse raw frames into a Request, or raise ProtocolError saying what is wrong."""
    try:
        identity = check_identity(frames[0]) if frames else None
    except ValueError as error:
        raise ProtocolError(f"bad identity frame: {error}") from None
    if identity is None:
        raise ProtocolError("missing identity frame")
    if len(frames) not in (4, 5):
        raise ProtocolError(f"expected 4 or 5 frames, got {len(frames)}", identity)
    req_id = _parse_int(frames[2], "req_id", identity)
    msg_len = _parse_int(frames[3], "msg_len", identity, req_id)
    options = _parse_options(frames[4], identity, req_id) if len(frames) == 5 else {}
    return Request(identity, req_id, frames[1], msg_len, options)


def decode_texts(request):
    """The request's texts as a Python list; ProtocolError if the payload is not JSON."""
    try:
        return from_json(request.payload)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("payload is not valid JSON", request.identity, request.req_id) from None
    except RecursionError:  # the parser's own depth limit: nesting deeper than any request has
        raise ProtocolError("payload is nested too deeply", request.identity, request.req_id) from None


def encode_result(identity, req_id, array, tokens=None, num_tokens=None, truncated=0, windows=None):
    return next(result_messages(identity, req_id, array, tokens, num_tokens, truncated, windows=windows))


def result_messages(identity, req_id, array, tokens=None, num_tokens=None, truncated=0, streamed=False,
                    windows=None, chunk_bytes=CHUNK_BYTES):
    """The messages that carry one result, made as they are taken: one, or with `streamed`, one per
    `chunk_bytes` of the array, each with its own copy of its bytes (so a chunk waiting to be read
    keeps no more of the array alive than itself)."""
    sent, layout = _layout(array)
    body = memoryview(np.ascontiguousarray(sent)).cast("B")
    header = {**layout, "num_tokens": num_tokens, "truncated": truncated, **({"windows": windows} if windows else {})}
    if not streamed or len(body) <= chunk_bytes:
        yield [topic(identity), to_json({**header, "tokens": tokens or ""}), body, b"%d" % req_id]
        return
    for offset in range(0, len(body), chunk_bytes):
        yield [topic(identity), to_json({**header, "tokens": (tokens or "") if offset == 0 else "", "offset": offset}),
               bytes(body[offset:offset + chunk_bytes]), b"%d" % req_id]


def _layout(array):
    """(the array whose bytes are sent, the header's dtype and shape): sparse rows as their wire form,
    uint8 bytes, with `sparse` saying how to read them."""
    if not isinstance(array, SparseVectors):
        return array, {"dtype": _dtype_name(array.dtype), "shape": list(array.shape)}
    body = np.frombuffer(array.to_bytes(), dtype=np.uint8)
    return body, {"dtype": "uint8", "shape": [len(body)],
                  "sparse": {"rows": len(array), "nnz": array.nnz, "dim": array.dim}}


@functools.cache
def _dtype_name(dtype):
    return dtype.name  # (numpy works it out anew each time, in microseconds)


def encode_error(identity, req_id, message, code=None):
    body = {"error": message, **({"code": code} if code else {})}
    return [topic(identity), json.dumps(body).encode(), b"", b"%d" % req_id]


def encode_refusal(identity, message):
    """What a subscriber refused for `identity` receives: an error for no request of its own."""
    return [refusal_topic(identity), *encode_error(identity, UNKNOWN_REQ_ID, message, FORBIDDEN)[1:]]


def encode_data(identity, req_id, data):
    return [topic(identity), json.dumps(data).encode(), b"%d" % req_id]


def decode_reply(frames):
    """The Reply in one published message (a chunk of a streamed result: see ReplyReader), or for
    frames that are no reply, an error Reply that says why (see unreadable)."""
    try:
        return _reply(from_json(frames[1]), frames)
    except READ_ERRORS as error:
        return unreadable(frames, error)


def reply_req_id(frames):
    """The request that a published message (a reply, or a chunk of one) answers."""
    return int(frames[-1])


def _reply(header, frames):
    req_id = reply_req_id(frames)
    if len(frames) == 3:
        return Reply(req_id, data=header)
    if "error" in header:
        return Reply(req_id, error=header["error"], code=header.get("code"))
    return _result(req_id, header, frames[2])


def _result(req_id, header, body):
    sparse = header.get("sparse")
    array = SparseVectors.from_bytes(body, **sparse) if sparse else \
        np.frombuffer(body, dtype=header["dtype"]).reshape(header["shape"])
    return Reply(req_id, array=array, tokens=header.get("tokens") or None, num_tokens=header.get("num_tokens"),
                 truncated=header.get("truncated") or 0, windows=header.get("windows"))


class ReplyReader:
    """Replies from published messages, a streamed result once its last chunk is in. Results
    whose chunks stopped coming (their request timed out) are forgotten beyond `max_partial`."""

    def __init__(self, max_partial=64):
        self.max_partial = max_partial
        self._partial = OrderedDict()  # req_id -> _Partial

    def read(self, frames):
        """The Reply that `frames` completes, or None while a streamed result is incomplete. Frames
        that are no reply (or a chunk that does not fit its result, which is then given up) make an
        error Reply that says why (see unreadable)."""
        try:
            return self._read(frames)
        except READ_ERRORS as error:
            reply = unreadable(frames, error)
            self._partial.pop(reply.req_id, None)
            return reply

    def _read(self, frames):
        header = from_json(frames[1])
        if len(frames) != 4 or "offset" not in header:
            return _reply(header, frames)
        req_id = reply_req_id(frames)
        partial = self._partial.get(req_id)
        if partial is None:
            partial = self._partial[req_id] = _Partial(header)
            while len(self._partial) > self.max_partial:
                self._partial.popitem(last=False)
        if not partial.add(header, frames[2]):
            return None
        del self._partial[req_id]
        return _result(req_id, partial.header, partial.body)


class _Partial:
    def __init__(self, header):
        self.header = header
        size = np.dtype(header["dtype"]).itemsize * math.prod(header["shape"])
        try:  # zeroed pages that the system gives as they are written: a header's claim alone costs nothing
            self.body = np.zeros(size, np.uint8)
        except (MemoryError, ValueError, OverflowError):
            raise ProtocolError(f"its header claims a result of {size} bytes, which this client cannot hold") from None
        self.seen = set()
        self.received = 0

    def add(self, header, chunk):
        """Place one chunk; True once every byte is in."""
        offset = header["offset"]
        if offset not in self.seen:
            if type(offset) is not int or not 0 <= offset <= len(self.body) - len(chunk):
                raise ProtocolError(f"a chunk of {len(chunk)} bytes at offset {offset!r} does not fit its result "
                                    f"of {len(self.body)} bytes")
            self.seen.add(offset)
            self.body[offset:offset + len(chunk)] = np.frombuffer(chunk, np.uint8)
            self.received += len(chunk)
            if offset == 0:
                self.header = header  # the first chunk carries the tokens
        return self.received >= len(self.body)


UNREADABLE = "the server sent a reply this client cannot read"
# what reading frames that are no reply raises: wrong JSON, or a header whose fields do not fit
READ_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)


def unreadable(frames, error):
    """The error Reply for `frames`, which are no reply (reading them raised `error`), under the
    request id they name, or UNKNOWN_REQ_ID (no request's) when that cannot be read either."""
    try:
        req_id = reply_req_id(frames)
    except (ValueError, IndexError):
        req_id = UNKNOWN_REQ_ID
    return Reply(req_id, error=f"{UNREADABLE}: {_why_unreadable(frames, error)}")


def _why_unreadable(frames, error):
    """What makes `frames` no reply, worked out once reading them has failed (with `error`)."""
    if not 3 <= len(frames) <= 4:
        return f"{len(frames)} frames, where a reply has 3 or 4"
    if isinstance(error, ProtocolError):
        return str(error)
    try:
        header = from_json(frames[1])
    except ValueError:
        return "its header is not JSON"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    if len(frames) == 4 and "error" not in header:
        missing = [key for key in ("dtype", "shape") if key not in header]
        if missing:
            return f"its header has no {missing[0]!r}"
        shape, sparse = header["shape"], header.get("sparse")
        if not isinstance(shape, list) or not all(type(size) is int for size in shape):
            return f"its shape {str(shape)[:100]} is not a list of integers"
        if sparse is not None and not isinstance(sparse, dict):
            return f"its sparse fields {str(sparse)[:100]} are not a JSON object"
        return f"its dtype {str(header['dtype'])[:100]!r} and shape {shape}: {error}"
    return f"{type(error).__name__}: {error}"


def _parse_int(frame, name, identity, req_id=UNKNOWN_REQ_ID):
    try:
        value = int(frame)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_FRAME_INT:
        raise ProtocolError(f"{name} frame is not an integer from 0 to 2**64-1", identity, req_id)
    return value


def _parse_options(frame, identity, req_id):
    try:
        options = from_json(frame)
    except (UnicodeDecodeError, ValueError, RecursionError):
        options = None
    if not isinstance(options, dict):
        raise ProtocolError("options frame is not a JSON object", identity, req_id)
    return options
