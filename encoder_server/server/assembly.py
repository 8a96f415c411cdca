"""The sink's pure logic: put a request's parts back together in input order, and finish its rows
as its registration says (model.outputs: windows merged, dimensions cut, precision).

Parts may arrive in any order, and before the ventilator's registration of their request.
A part seen twice, or one of a request already finished or forgotten, is ignored, so a re-sent
job can never duplicate rows; one with rows past its request's end is refused (PartError).
Requests nobody listens for are given up after a grace period.
"""
import time
from collections import deque
from dataclasses import dataclass, field

from encoder_client.sparse import SparseVectors

from ..model.arrays import concat_parts
from ..model.outputs import Output, finish
from .messages import Registration

REMEMBERED_FINISHED = 100_000  # finished requests whose late duplicate parts are recognised
ORPHAN_PARTS_TTL = 300.0       # parts whose registration never came are dropped after this


class PartError(ValueError):
    """A part that cannot belong to its request."""


@dataclass
class Completed:
    identity: bytes
    req_id: int
    array: object
    tokens: list = None
    num_tokens: int = 0
    truncated: int = 0
    streamed: bool = False
    windows: list = None  # per text, the windows it was cut into (when they were asked for)


@dataclass
class _Pending:
    registration: Registration = None  # the ventilator's, once it has come
    parts: dict = field(default_factory=dict)  # offset -> (array, tokens)
    rows: int = 0
    num_tokens: int = 0
    truncated: int = 0
    heard: float = field(default_factory=time.monotonic)  # last time someone listened for it


class Assembler:
    def __init__(self):
        self._pending = {}
        self._finished = set()
        self._finished_order = deque()

    def register(self, seq, registration):
        if seq in self._finished:
            return None
        self._pending.setdefault(seq, _Pending()).registration = registration
        return self._complete(seq)

    def add_part(self, seq, offset, array, tokens=None, num_tokens=0, truncated=0):
        if seq in self._finished:
            return None
        registration = self._pending[seq].registration if seq in self._pending else None
        if not len(array) or (registration is not None and offset + len(array) > registration.rows):
            raise PartError(f"a part of {len(array)} rows at offset {offset} does not fit request {seq}"
                            + (f" of {registration.rows} rows" if registration is not None else ""))
        if registration is not None and registration.sparse != isinstance(array, SparseVectors):
            raise PartError(f"a part of {type(array).__name__} does not fit request {seq}, whose model gives "
                            f"{'sparse' if registration.sparse else 'dense'} rows")
        if registration is not None and registration.width not in (None, array.shape[-1]):
            raise PartError(f"a part of {array.shape[-1]} values per row does not fit request {seq}, whose model "
                            f"gives {registration.width}")
        pending = self._pending.setdefault(seq, _Pending())
        if pending.parts and type(next(iter(pending.parts.values()))[0]) is not type(array):
            raise PartError(f"a part of {type(array).__name__} does not fit request {seq}, whose other parts are not")
        if offset not in pending.parts:
            pending.parts[offset] = (array, tokens)
            pending.rows += len(array)
            pending.num_tokens += num_tokens
            pending.truncated += truncated
        return self._complete(seq)

    def forget(self, seq):
        """Drop a request; returns its registration, if it had arrived."""
        pending = self._pending.get(seq)
        self._finish(seq)
        return pending.registration if pending else None

    def reset(self):
        """Forget every request; returns the registrations of those whose had arrived."""
        registrations = [pending.registration for pending in self._pending.values() if pending.registration]
        for seq in list(self._pending):
            self._finish(seq)
        return registrations

    def abandoned(self, is_listening, grace, now=None):
        """Forget the requests nobody has listened for in `grace` seconds; returns their seqs."""
        now = time.monotonic() if now is None else now
        given_up = []
        for seq, pending in list(self._pending.items()):
            registration = pending.registration
            if registration is None:
                if now - pending.heard > ORPHAN_PARTS_TTL:
                    self._finish(seq)
            elif is_listening(registration.identity):
                pending.heard = now
            elif now - pending.heard > grace:
                given_up.append(seq)
                self._finish(seq)
        return given_up

    def __len__(self):
        return len(self._pending)

    def _complete(self, seq):
        pending = self._pending[seq]
        registration = pending.registration
        if registration is None or pending.rows < registration.rows:
            return None
        self._finish(seq)
        parts = [pending.parts[offset] for offset in sorted(pending.parts)]
        tokens = [t for _, part_tokens in parts for t in part_tokens] if registration.with_tokens else None
        arrays = [array for array, _ in parts]
        array = SparseVectors.concat(arrays) if isinstance(arrays[0], SparseVectors) else concat_parts(arrays)
        output = Output(**registration.output) if registration.output else None
        return Completed(registration.identity, registration.req_id, finish(array, output) if output else array,
                         tokens, pending.num_tokens, pending.truncated, registration.streamed,
                         output and output.windows)

    def _finish(self, seq):
        self._pending.pop(seq, None)
        if seq not in self._finished:
            self._finished.add(seq)
            self._finished_order.append(seq)
            if len(self._finished_order) > REMEMBERED_FINISHED:
                self._finished.discard(self._finished_order.popleft())
