"""Every message between the server's own processes (clients never see these). Pure.

    worker     -> ventilator  Ready | Heartbeat (metrics since the last one) | Dropped (budget spent)
                              | Refused (its texts break the request's rules, e.g. truncate=False)
    ventilator -> worker      Jobs | Heartbeat | Who (a worker it does not know: say READY)
    ventilator -> sink        Register | Publish (a reply for a client) | Forget (request cancelled)
                              | Reset (a new ventilator: fail every request held)
    worker     -> sink        Parts
    sink       -> ventilator  Done (the jobs whose parts it has) | Gone (nobody listens for the request)
                              | Unread (a client left too much unread: drop its queued work)
                              | BadPart (a worker's part for this job could not be used)
    supervisor -> ventilator  WorkerExited | SinkRestarted  (these go over a multiprocessing pipe)
    ventilator -> supervisor  WorkerSilent

Jobs, Parts, Done and Register each carry as many items as were ready at once (the jobs dealt to
one worker in a turn of the ventilator's loop, the parts of one forward pass, ...): under load a
process then sends and receives one message for many requests, not several for each.

Each ZeroMQ message has one encode/decode pair: `message.frames()`, and `decode(frames)` for
all of them. Decoding raises MessageError and nothing else for frames that are no message of
ours, so a loop that catches it outlives anything a peer on a worker port sends.

Time crosses hosts only as durations: a Job carries how much of its client's timeout is left
and how long it has waited, never a clock reading, so a worker whose clock is off by any amount
measures both against its own monotonic clock from the moment it receives the job.
"""
from dataclasses import dataclass, field

import numpy as np

from encoder_client.protocol import ERROR_CODES, TOO_LARGE, TOPIC_END
from encoder_client.sparse import SparseVectors
from encoder_client.status import check_metrics

from .metrics import check_delta
from .wire import MessageError, as_bytes, count, from_json, is_count, object_of, objects, to_json, typed

_KINDS = {}
# the version of these messages: a worker that says READY with another (one of an older release on
# another host) is refused, with a line in the log, instead of being dealt jobs it cannot read
INTERNAL_PROTOCOL = 4
RESTART_ERROR = "a process of the server died and was restarted while this request was in flight; send it again"


def decode(frames):
    """The message these frames hold (zmq.Frame or bytes); MessageError if they hold none."""
    kind = as_bytes(frames[0]) if frames else b""
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

    def stamped(self, budget_ms, waited_ms):
        """This job as it is sent: with its client's remaining budget and the time it has waited. (A
        copy made through its __dict__: dataclasses.replace checks all its fields again, 10% of the
        ventilator's work for a one-text request.)"""
        job = object.__new__(Job)
        job.__dict__.update(vars(self), budget_ms=budget_ms, waited_ms=waited_ms)
        return job

    def spent(self, received_at, now):
        """Whether its budget ran out between `received_at` and `now` (both on one monotonic clock)."""
        return self.budget_ms is not None and (now - received_at) * 1000 >= self.budget_ms


@_kind(b"JOBS")
@dataclass(frozen=True)
class Jobs:
    """Jobs for one worker, in the order it should take them."""
    jobs: tuple

    def frames(self):
        return [self.KIND, to_json([vars(job) for job in self.jobs])]

    @classmethod
    def decode(cls, frames):
        return cls(tuple(typed(Job, job) for job in objects(frames[0])))


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
    tokenizers: int = 1      # threads it tokenizes jobs on, ahead of its lanes
    model: str = None        # the name of the model it serves (None: the default model)
    calibration: dict = None # int8 ranges of its model on the built-in sample (worker.calibrate)
    protocol: int = None     # the INTERNAL_PROTOCOL it speaks
    fast: bool = False       # whether its passes are short (a GPU, the zero backend): it holds a job more a lane

    def frames(self):
        return [self.KIND, to_json(vars(self))]

    @classmethod
    def decode(cls, frames):
        return typed(cls, object_of(frames[0]))


@_kind(b"HEARTBEAT")
@dataclass(frozen=True)
class Heartbeat:
    metrics: dict = field(default_factory=dict)  # a worker's: what it recorded since its last heartbeat

    def frames(self):
        return [self.KIND, to_json(self.metrics)]

    @classmethod
    def decode(cls, frames):
        metrics = object_of(frames[0]) if frames else {}
        return cls(check_delta(check_metrics(metrics)) if metrics else {})


@dataclass(frozen=True)
class _Number:
    """A message that is one number: a job id or a request's seq."""
    number: int

    def frames(self):
        return [self.KIND, b"%d" % self.number]

    @classmethod
    def decode(cls, frames):
        return cls(count(as_bytes(frames[0])))


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
        return [self.KIND, to_json(vars(self))]

    @classmethod
    def decode(cls, frames):
        refused = typed(cls, object_of(frames[0]))
        if refused.code not in ERROR_CODES:
            raise MessageError(f"unknown error code {refused.code[:32]!r}")
        return refused


@_kind(b"DONE")
@dataclass(frozen=True)
class Done:
    """The sink has the parts of these jobs."""
    job_ids: tuple

    def frames(self):
        return [self.KIND, b" ".join(b"%d" % job_id for job_id in self.job_ids)]

    @classmethod
    def decode(cls, frames):
        job_ids = tuple(count(number) for number in as_bytes(frames[0]).split())
        if not job_ids:
            raise MessageError("a DONE message without job ids")
        return cls(job_ids)


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
        return cls(as_bytes(frames[0]), count(as_bytes(frames[1])))


@_kind(b"BADPART")
@dataclass(frozen=True)
class BadPart:
    """A part for job `job_id` could not be used (malformed, or not the shape its request needs);
    `remote`: it came over the network, not from a local worker."""
    job_id: int
    remote: bool

    def frames(self):
        return [self.KIND, to_json(vars(self))]

    @classmethod
    def decode(cls, frames):
        return typed(cls, object_of(frames[0]))


def job_ids_in(frames):
    """The job ids that a PARTS message which failed to decode names, as far as they can be read."""
    try:
        if as_bytes(frames[0]) == Parts.KIND:
            headers = from_json(frames[1])
            return [header["job_id"] for header in headers if isinstance(header, dict)
                    and is_count(header.get("job_id"))] if isinstance(headers, list) else []
    except (ValueError, IndexError, RecursionError):
        pass
    return []


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
        return cls(count(as_bytes(frames[0])), as_bytes(frames[1]).decode(), as_bytes(frames[2]).decode())


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
    """Requests admitted: {seq: Registration}."""
    registrations: dict

    def frames(self):
        headers = [{"seq": seq, **vars(registration)} for seq, registration in self.registrations.items()]
        for header in headers:
            del header["identity"]
        return [self.KIND, to_json(headers), *(registration.identity for registration in self.registrations.values())]

    @classmethod
    def decode(cls, frames):
        headers = objects(frames[0])
        if len(headers) != len(frames) - 1:
            raise MessageError(f"a REGISTER of {len(headers)} requests with {len(frames) - 1} identities")
        registrations = {}
        for header, identity in zip(headers, frames[1:]):
            seq = header.pop("seq", None)
            if not is_count(seq):
                raise MessageError("Register.seq is not a valid int")
            registrations[seq] = typed(Registration, {"identity": as_bytes(identity), **header})
        return cls(registrations)


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
        topic = as_bytes(self.reply[0])
        return topic[:-len(TOPIC_END)] if topic.endswith(TOPIC_END) else topic


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

    def header(self):
        """Its JSON-able fields, and its body's bytes (see Parts)."""
        header = {"seq": self.seq, "job_id": self.job_id, "offset": self.offset, "shape": list(self.array.shape),
                  "tokens": self.tokens, "num_tokens": self.num_tokens, "truncated": self.truncated}
        if isinstance(self.array, SparseVectors):
            return {**header, "sparse": self.array.nnz}, self.array.to_bytes()
        return header, memoryview(np.ascontiguousarray(self.array, dtype=np.float32)).cast("B")

    @classmethod
    def of(cls, header, body):
        shape, nnz = header.pop("shape", None), header.pop("sparse", None)
        if not (isinstance(shape, list) and len(shape) in (2, 3) and all(is_count(n) for n in shape)) or (
                nnz is not None and not (is_count(nnz) and len(shape) == 2)):
            raise MessageError(f"a PART's shape must be 2 or 3 counts, got {str(shape)[:64]}")
        array = np.frombuffer(body, dtype=np.float32).reshape(shape) if nnz is None else \
            SparseVectors.from_bytes(body, shape[0], nnz, shape[1])
        part = typed(cls, {**header, "array": array})  # (a header may not name its own array)
        if part.tokens is not None and not (len(part.tokens) == len(array) and
                                            all(isinstance(row, list) for row in part.tokens)):
            raise MessageError("a PART's tokens must be one list per row")
        return part


@_kind(b"PARTS")
@dataclass(frozen=True, eq=False)
class Parts:
    """The parts of the jobs one forward pass finished: their headers in one frame, their bodies
    one after another in the next, each header saying its body's length in `bytes`."""
    parts: tuple

    def frames(self):
        headers, bodies = zip(*(part.header() for part in self.parts))
        headers = [{**header, "bytes": len(body)} for header, body in zip(headers, bodies)]
        return [self.KIND, to_json(headers), b"".join(bodies)]

    @classmethod
    def decode(cls, frames):
        headers = objects(frames[0])
        body = memoryview(frames[1].buffer if hasattr(frames[1], "buffer") else frames[1]).cast("B")
        parts, start = [], 0
        for header in headers:
            size = header.pop("bytes", None)
            if not is_count(size) or start + size > len(body):
                raise MessageError("a PART's bytes must be a count within the body")
            parts.append(Part.of(header, body[start:start + size]))
            start += size
        if start != len(body):
            raise MessageError(f"a PARTS body of {len(body)} bytes, {len(body) - start} past its parts")
        return cls(tuple(parts))


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
