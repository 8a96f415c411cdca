"""The sink's pure logic: put a request's parts back together in input order.

Parts may arrive in any order, and before the ventilator's registration of their request.
A part seen twice is ignored, so a re-sent job can never duplicate rows.
"""
from dataclasses import dataclass, field

from .arrays import concat_parts


@dataclass
class Registration:
    identity: bytes
    req_id: int
    rows: int
    with_tokens: bool = False


@dataclass
class Completed:
    identity: bytes
    req_id: int
    array: object
    tokens: list = None


@dataclass
class _Pending:
    registration: Registration = None
    parts: dict = field(default_factory=dict)  # offset -> (array, tokens)
    rows: int = 0


class Assembler:
    def __init__(self):
        self._pending = {}

    def register(self, seq, registration):
        self._pending.setdefault(seq, _Pending()).registration = registration
        return self._complete(seq)

    def add_part(self, seq, offset, array, tokens=None):
        pending = self._pending.setdefault(seq, _Pending())
        if offset not in pending.parts:
            pending.parts[offset] = (array, tokens)
            pending.rows += len(array)
        return self._complete(seq)

    def __len__(self):
        return len(self._pending)

    def _complete(self, seq):
        pending = self._pending[seq]
        registration = pending.registration
        if registration is None or pending.rows < registration.rows:
            return None
        del self._pending[seq]
        parts = [pending.parts[offset] for offset in sorted(pending.parts)]
        tokens = [t for _, part_tokens in parts for t in part_tokens] if registration.with_tokens else None
        return Completed(registration.identity, registration.req_id,
                         concat_parts([array for array, _ in parts]), tokens)
