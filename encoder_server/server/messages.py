"""Every message between the server's own processes (clients never see these). Pure.

    worker     -> ventilator  Ready | Heartbeat (metrics since the last one) | Dropped (budget spent)
                              | Refused (its texts break the request's rules, e.g. truncate=False)
    ventilator -> worker      Job | Heartbeat | Who (a worker it does not know: say READY)
    ventilator -> sink        Register | Publish (a reply for a client) | Forget (request cancelled)
                              | Reset (a new ventilator: fail every request held)
    worker     -> sink        Part
    sink       -> ventilator  Done (one per finished job) | Gone (nobody listens for the request)
                              | Unread (a client left too much unread: drop its queued work)
                              | BadPart (a worker's part for this job could not be used)
    supervisor -> ventilator  WorkerExited | SinkRestarted  (these go over a multiprocessing pipe)
    ventilator -> supervisor  WorkerSilent

Each ZeroMQ message has one encode/decode pair: `message.frames()`, and `decode(frames)` for
all of them. Decoding raises MessageError and nothing else for frames that are no message of
ours, so a loop that catches it outlives anything a peer on a worker port sends.

Time crosses hosts only as durations: a Job carries how much of its client's timeout is left
and how long it has waited, never a clock reading, so a worker whose clock is off by any amount
measures both against its own monotonic clock from the moment it receives the job.
"""
import json
import math
from dataclasses import MISSING, dataclass, field, fields

import numpy as np

from encoder_client.protocol import ERROR_CODES, TOO_LARGE, TOPIC_END
from encoder_client.sparse import SparseVectors
from encoder_client.status import check_metrics

from .metrics import check_delta

_KINDS = {}
RESTART_ERROR = "a process of the server died and was restarted while this request was in flight; send it again"


class MessageError(ValueError):
    """Frames that are no message of ours."""


def decode(frames):
    """The message these frames hold (zmq.Frame or bytes); MessageError if they hold none."""
    kind = _bytes(frames[0]) if frames else b""
    message_type = _KINDS.get(kind)
    if message_type is None:
        raise MessageError(f"unknown message kind {kind[:32]!r}")
    try:
        return message_type.decode(frames[1:])
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as error:
        raise MessageError(f"malformed {kind.decode()} message: {error}") from None


def decode_or_log(frames, log, sender):
    """The message these frames hold, or None once `log` has said why they hold none."""
    try:
        return decode(frames)
    except MessageError as error:
        log.warning("dropped a message from %s: %s", sender, error)
        return None


def _kind(name):
    """Register a message class under its first frame."""
    def register(message_type):
        message_type.KIND = name
        _KINDS[name] = message_type
        return message_type
    return register


@_kind(b"JOB")
@dataclass(frozen=True)
class Job:
    """Texts for a worker: part of request `seq`, from its text `offset` on."""
    job_id: int
    seq: int
    offset: int
    texts: list
    priority: bool = False
    is_tokenized: bool = False
    with_tokens: bool = False
    budget_ms: float = None  # how long its client still waits, from the moment a worker receives it
    waited_ms: float = 0.0   # how long it had waited since its request was admitted, when it was sent
    prompt: str = ""         # prepended to each text
    normalize: bool = False  # L2-normalize each row
    truncate: bool = True    # False: refuse a text longer than the server's max_seq_len
    query: str = None        # a reranker's: the texts are documents, each scored against it
    raw_scores: bool = False # a reranker's: scores without the model's activation
    token_ids: bool = False  # the texts are token-id rows (windows of long texts), tokenized already
    top_k: int = None        # a sparse model's: the most non-zero entries kept per row

    def frames(self):
        return [self.KIND, _json(vars(self))]

    @classmethod
    def decode(cls, frames):
        return _typed(cls, _object(frames[0]))

    def spent(self, received_at, now):
        """Whether its budget ran out between `received_at` and `now` (both on one monotonic clock)."""
        return self.budget_ms is not None and (now - received_at) * 1000 >= self.budget_ms


@_kind(b"WHO")
@dataclass(frozen=True)
class Who:
    """The ventilator does not know this worker (it restarted, or gave the worker up): say READY."""

    def frames(self):
        return [self.KIND]

    @classmethod
    def decode(cls, frames):
        return cls()


@_kind(b"READY")
@dataclass(frozen=True)
class Ready:
    pid: int
    host: str
    remote: bool = False
    lanes: int = 1           # forward passes it runs at once
    model: str = None        # the name of the model it serves (None: the default model)
    calibration: dict = None # int8 ranges of its model on the built-in sample (worker.calibrate)

    def frames(self):
        return [self.KIND, _json(vars(self))]

    @classmethod
    def decode(cls, frames):
        return _typed(cls, _object(frames[0]))


@_kind(b"HEARTBEAT")
@dataclass(frozen=True)
class Heartbeat:
    metrics: dict = field(default_factory=dict)  # a worker's: what it recorded since its last heartbeat

    def frames(self):
        return [self.KIND, _json(self.metrics)]

    @classmethod
    def decode(cls, frames):
        metrics = _object(frames[0]) if frames else {}
        return cls(check_delta(check_metrics(metrics)) if metrics else {})


@dataclass(frozen=True)
class _Number:
    """A message that is one number: a job id or a request's seq."""
    number: int

    def frames(self):
        return [self.KIND, b"%d" % self.number]

    @classmethod
    def decode(cls, frames):
        return cls(_count(_bytes(frames[0])))


@_kind(b"DROPPED")
class Dropped(_Number):
    """A worker skipped job `number`: its budget ran out before the worker reached it."""


@_kind(b"REFUSED")
@dataclass(frozen=True)
class Refused:
    """A worker would not compute job `job_id`: `error` says why, for its client (`code`: one of
    protocol.ERROR_CODES)."""
    job_id: int
    error: str
    code: str = TOO_LARGE

    def frames(self):
        return [self.KIND, _json(vars(self))]

    @classmethod
    def decode(cls, frames):
        refused = _typed(cls, _object(frames[0]))
        if refused.code not in ERROR_CODES:
            raise MessageError(f"unknown error code {refused.code[:32]!r}")
        return refused


@_kind(b"DONE")
class Done(_Number):
    """The sink has job `number`'s part."""


@_kind(b"GONE")
class Gone(_Number):
    """Nobody has listened for request `number` in a long while; the sink gave it up."""


@_kind(b"UNREAD")
@dataclass(frozen=True)
class Unread:
    """The sink dropped `replies` replies for `identity`, which left too much unread: its queued
    work is abandoned."""
    identity: bytes
    replies: int = 1

    def frames(self):
        return [self.KIND, self.identity, b"%d" % self.replies]

    @classmethod
    def decode(cls, frames):
        return cls(_bytes(frames[0]), _count(_bytes(frames[1])))


@_kind(b"BADPART")
@dataclass(frozen=True)
class BadPart:
    """A part for job `job_id` could not be used (malformed, or not the shape its request needs);
    `remote`: it came over the network, not from a local worker."""
    job_id: int
    remote: bool

    def frames(self):
        return [self.KIND, _json(vars(self))]

    @classmethod
    def decode(cls, frames):
        return _typed(cls, _object(frames[0]))


def job_id_in(frames):
    """The job id a PART that failed to decode names, when it can be read; else None."""
    try:
        if _bytes(frames[0]) == Part.KIND:
            job_id = _object(frames[1]).get("job_id")
            return job_id if _is_count(job_id) else None
    except (ValueError, IndexError, RecursionError):
        pass
    return None


@_kind(b"FORGET")
@dataclass(frozen=True)
class Forget:
    """Drop request `seq`; with `error`, tell its client why (`code`: one of protocol.ERROR_CODES)."""
    seq: int
    error: str = ""
    code: str = ""

    def frames(self):
        return [self.KIND, b"%d" % self.seq, self.error.encode(), self.code.encode()]

    @classmethod
    def decode(cls, frames):
        return cls(_count(_bytes(frames[0])), _bytes(frames[1]).decode(), _bytes(frames[2]).decode())


@_kind(b"RESET")
@dataclass(frozen=True)
class Reset:
    """The ventilator (re)started: the requests the sink holds from before will never complete."""

    def frames(self):
        return [self.KIND]

    @classmethod
    def decode(cls, frames):
        return cls()


@dataclass(frozen=True)
class Registration:
    """What the sink needs to reassemble a request and whom to send it to."""
    identity: bytes
    req_id: int
    rows: int
    with_tokens: bool = False
    streamed: bool = False  # its client takes a large result in chunks
    width: int = None       # floats per row (per token) of its model's parts (None: not checked)
    output: dict = None     # how its rows are finished before they are served (model.outputs.Output)
    sparse: bool = False    # its model's parts are SparseVectors


@_kind(b"REGISTER")
@dataclass(frozen=True)
class Register:
    seq: int
    registration: Registration

    def frames(self):
        header = {"seq": self.seq, **vars(self.registration)}
        del header["identity"]
        return [self.KIND, self.registration.identity, _json(header)]

    @classmethod
    def decode(cls, frames):
        header = _object(frames[1])
        seq = _typed(_Seq, {"seq": header.pop("seq", None)}).seq
        return cls(seq, _typed(Registration, {"identity": _bytes(frames[0]), **header}))


@_kind(b"PUBLISH")
@dataclass(frozen=True)
class Publish:
    """A reply for a client, as the frames the sink publishes (the first is the client's topic)."""
    reply: list

    def frames(self):
        return [self.KIND, *self.reply]

    @classmethod
    def decode(cls, frames):
        if not frames:
            raise MessageError("a PUBLISH message without a reply")
        return cls(list(frames))

    @property
    def identity(self):
        topic = _bytes(self.reply[0])
        return topic[:-len(TOPIC_END)] if topic.endswith(TOPIC_END) else topic


@_kind(b"PART")
@dataclass(frozen=True, eq=False)
class Part:
    """A job's rows: float32 [rows, dim], or [rows, seq, dim] with token-level pooling, or a sparse
    model's SparseVectors (sent in their wire form, `sparse` giving their non-zero count)."""
    seq: int
    job_id: int
    offset: int
    array: object
    tokens: list = None
    num_tokens: int = 0
    truncated: int = 0  # how many of its texts were cut at max_seq_len

    def frames(self):
        header = {"seq": self.seq, "job_id": self.job_id, "offset": self.offset, "shape": list(self.array.shape),
                  "tokens": self.tokens, "num_tokens": self.num_tokens, "truncated": self.truncated}
        if isinstance(self.array, SparseVectors):
            return [self.KIND, _json({**header, "sparse": self.array.nnz}), self.array.to_bytes()]
        return [self.KIND, _json(header), memoryview(np.ascontiguousarray(self.array, dtype=np.float32)).cast("B")]

    @classmethod
    def decode(cls, frames):
        header = _object(frames[0])
        shape, nnz = header.pop("shape", None), header.pop("sparse", None)
        if not (isinstance(shape, list) and len(shape) in (2, 3) and all(_is_count(n) for n in shape)) or (
                nnz is not None and not (_is_count(nnz) and len(shape) == 2)):
            raise MessageError(f"a PART's shape must be 2 or 3 counts, got {str(shape)[:64]}")
        body = frames[1].buffer if hasattr(frames[1], "buffer") else frames[1]
        array = np.frombuffer(body, dtype=np.float32).reshape(shape) if nnz is None else \
            SparseVectors.from_bytes(body, shape[0], nnz, shape[1])
        part = _typed(cls, {"array": array, **header})
        if part.tokens is not None and not (len(part.tokens) == len(array) and
                                            all(isinstance(row, list) for row in part.tokens)):
            raise MessageError("a PART's tokens must be one list per row")
        return part


@dataclass(frozen=True)
class WorkerExited:
    """The supervisor saw a local worker exit; it restarts it."""
    pid: int
    exitcode: int


@dataclass(frozen=True)
class SinkRestarted:
    """The sink died and the supervisor started it again: the requests in flight are lost."""


@dataclass(frozen=True)
class WorkerSilent:
    """The ventilator gave up on a local worker that stopped sending heartbeats: kill it."""
    pid: int


@dataclass(frozen=True)
class _Seq:
    seq: int


def _typed(message_type, values):
    """message_type(**values), once every field is present (or has a default) and has its type;
    numbers must be finite, and ints (ids, counts) not negative."""
    known = {f.name: f for f in fields(message_type)}
    unknown = set(values) - set(known)
    if unknown:
        raise MessageError(f"unknown field {sorted(unknown)[0]!r} in {message_type.__name__}")
    for name, spec in known.items():
        if name not in values:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise MessageError(f"{message_type.__name__} has no field {name!r}")
        elif not _has_type(values[name], spec.type, spec.default):
            raise MessageError(f"{message_type.__name__}.{name} is not a valid {getattr(spec.type, '__name__', spec.type)}")
    return message_type(**values)


def _has_type(value, kind, default):
    if value is None:
        return default is None
    if kind is int:
        return _is_count(value)
    if kind is float:
        return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if kind is object:
        return True
    return isinstance(value, kind)


def _is_count(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _count(frame):
    value = int(frame)
    if value < 0:
        raise MessageError(f"expected a count, got {value}")
    return value


def _json(value):
    return json.dumps(value).encode()


def _object(frame):
    value = json.loads(_bytes(frame))
    if not isinstance(value, dict):
        raise MessageError(f"expected a JSON object, got {type(value).__name__}")
    return value


def _bytes(frame):
    return frame.bytes if hasattr(frame, "bytes") else bytes(frame)
