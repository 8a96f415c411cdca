"""encoder_server.server.messages: every internal message survives a round trip, and frames that are no
message of ours raise MessageError, never anything else."""
import json

import numpy as np
import pytest
import zmq

from encoder_server.server import messages
from encoder_server.server.messages import MessageError
from encoder_server.server.metrics import Metrics

ROWS = np.arange(12, dtype=np.float32).reshape(3, 4)
TOKEN_LEVEL = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

EVERY_MESSAGE = [
    messages.Jobs((messages.Job(7, 3, 64, ["a text", "another"], priority=True, is_tokenized=False, with_tokens=True,
                                budget_ms=1234.5, waited_ms=12.0),
                   messages.Job(8, 3, 0, [["pre", "split"]], is_tokenized=True))),
    messages.Jobs((messages.Job(9, 4, 0, ["one"]),)),
    messages.Jobs((messages.Job(10, 5, 0, ["x"], prompt="\ud800"),)),  # orjson refuses it: json writes and reads it
    messages.Ready(4242, "host-a", remote=True),
    messages.Ready(4243, "host-b", lanes=2, tokenizers=4, protocol=messages.INTERNAL_PROTOCOL, fast=True),
    messages.Who(),
    messages.Reset(),
    messages.Heartbeat(Metrics().take()),
    messages.Heartbeat(),
    messages.Dropped(99),
    messages.Done((2 ** 40 + 1,)),
    messages.Done((3, 1, 2)),
    messages.Gone(5),
    messages.Forget(5, "texts 0 to 3 made a worker crash twice"),
    messages.Forget(6),
    messages.Register({11: messages.Registration(b"\x00client\xff", 17, rows=300, with_tokens=True)}),
    messages.Register({12: messages.Registration(b"a", 1, rows=1), 13: messages.Registration(b"", 2, rows=3,
                                                                                              streamed=True)}),
    messages.Publish([b"client\0", b'{"dtype": "float32"}', b"\x00" * 8, b"17"]),
    messages.Unread(b"\xffa client", 3),
    messages.BadPart(12, remote=True),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    assert messages.decode(message.frames()) == message


@pytest.mark.parametrize("array, tokens", [(ROWS, None), (TOKEN_LEVEL, [["[CLS]", "a", "[SEP]"]] * 2)])
def test_parts_round_trip_as_bytes_and_as_zero_copy_frames(array, tokens):
    first = messages.Part(seq=3, job_id=7, offset=64, array=array, tokens=tokens, num_tokens=6)
    second = messages.Part(seq=4, job_id=8, offset=0, array=array[:1] * 2, num_tokens=2, truncated=1)
    frames = messages.Parts((first, second)).frames()
    assert len(frames) == 3  # the kind, the headers, the bodies: however many parts
    for frames in (frames, [zmq.Frame(bytes(frame)) for frame in frames]):
        decoded = messages.decode(frames).parts
        assert [(part.seq, part.job_id, part.offset, part.tokens, part.num_tokens, part.truncated)
                for part in decoded] == [(3, 7, 64, tokens, 6, 0), (4, 8, 0, None, 2, 1)]
        np.testing.assert_array_equal(decoded[0].array, array)
        np.testing.assert_array_equal(decoded[1].array, array[:1] * 2)
        assert decoded[0].array.dtype == np.float32


def test_a_sparse_part_travels_as_its_entries():
    from encoder_client.sparse import SparseVectors
    rows = SparseVectors.from_dense(np.array([[0, 1.5, 0, 0], [0, 0, 0, 0], [2, 0, 0, -1]], dtype=np.float32))
    part = messages.Part(seq=3, job_id=7, offset=0, array=rows, tokens=[["b"], [], ["a", "d"]])
    dense = messages.Part(seq=4, job_id=8, offset=0, array=ROWS)
    frames = messages.Parts((part, dense)).frames()
    assert len(frames[2]) == 4 * 8 + 3 * 8 + ROWS.nbytes  # offsets, then an index and a value per entry
    decoded, other = messages.decode([zmq.Frame(bytes(frame)) for frame in frames]).parts
    assert isinstance(decoded.array, SparseVectors) and decoded.tokens == part.tokens
    np.testing.assert_array_equal(decoded.array.to_dense(), rows.to_dense())
    np.testing.assert_array_equal(other.array, ROWS)


def test_publish_keeps_the_identity_of_its_reply():
    assert messages.decode(messages.Publish([b"who", b"{}", b"1"]).frames()).identity == b"who"


def test_messages_of_one_number_are_told_apart():
    assert messages.decode(messages.Gone(1).frames()) != messages.Dropped(1)


def _heartbeat_with(**fields):
    return json.dumps({**Metrics().take(), **fields}).encode()


def _parts(header, body=b"\x00" * 8, size=None):
    """PARTS frames of one part: its header, with its body's length unless `size` says otherwise."""
    return [b"PARTS", json.dumps([{**header, "bytes": len(body) if size is None else size}]).encode(), body]


ONE = {"seq": 1, "job_id": 1, "offset": 0}


@pytest.mark.parametrize("frames", [
    [],
    [b"NOPE", b"{}"],
    [b"JOBS"],
    [b"JOBS", b"not json"],
    [b"JOBS", b"[1, 2]"],
    [b"JOBS", b"[]"],
    [b"JOBS", b'{"job_id": 1, "seq": 1, "offset": 0, "texts": []}'],
    [b"JOBS", b'[{"job_id": 1}]'],
    [b"JOBS", b'[{"job_id": 1, "seq": 1, "offset": 0, "texts": [], "evil": 1}]'],
    [b"JOBS", b"[" * 100000 + b"]" * 100000],
    [b"JOB", b'{"job_id": 1, "seq": 1, "offset": 0, "texts": []}'],  # one job alone is no message any more
    [b"READY", b"\xff\xfe"],
    [b"DONE", b"seven"],
    [b"DONE", b"1 -2"],
    [b"DONE", b""],
    [b"DONE"],
    [b"FORGET", b"1"],
    [b"REGISTER", b"id"],
    [b"REGISTER", b'[{"seq": 1, "req_id": 1, "rows": 2}]'],
    [b"REGISTER", b'[{"req_id": 1, "rows": 2}]', b"id"],
    [b"REGISTER", b'[{"seq": 1, "req_id": 1, "rows": 2}]', b"id", b"another id"],
    [b"PUBLISH"],
    [b"HEARTBEAT", b'{"histograms": [], "tokens": {}, "passes": 1}'],
    [b"HEARTBEAT", b'{"passes": 3}'],
    _parts({**ONE, "shape": [2, 4]}, b"\x00" * 7),
    _parts({**ONE, "shape": [3]}),
    _parts(ONE),
    _parts({**ONE, "shape": [2]})[:2],
    _parts({**ONE, "shape": [2, 1]}, size=9),
    _parts({**ONE, "shape": [2, 1]}, size=-1),
    _parts({**ONE, "shape": [1, 1]}, size=4),  # bytes past its parts
    [b"PARTS", b"[]", b""],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 1]}', b"\x00" * 8],  # one part is no message
    # what a hostile peer on an open worker port sent, each of which once ended the ventilator or the sink
    [b"HEARTBEAT", _heartbeat_with(histograms=5)],
    [b"HEARTBEAT", _heartbeat_with(histograms={"batch_rows": 5})],
    [b"HEARTBEAT", _heartbeat_with(histograms={"batch_rows": {"counts": [1], "sum": 0, "count": 1}})],
    [b"HEARTBEAT", _heartbeat_with(passes=-1)],
    [b"HEARTBEAT", _heartbeat_with(tokens={"real": "many", "padded": 0})],
    [b"DROPPED"],
    [b"DROPPED", b"-4"],
    [b"PARTS", b"not json", b"\x00" * 8],
    _parts({**ONE, "shape": [2, 1], "dtype": "object"}),
    _parts({**ONE, "offset": -5, "shape": [2, 1]}),
    _parts({**ONE, "shape": [2, 1], "num_tokens": "9"}),
    _parts({**ONE, "shape": [2, 1], "tokens": [["a"]]}),
    _parts({**ONE, "shape": [2, 1, 1, 1]}),
    [b"JOBS", b'[{"job_id": 1, "seq": 1, "offset": 0, "texts": "not a list"}]'],
    [b"READY", b'{"pid": "1", "host": "h"}'],
    [b"REFUSED", b'{"job_id": 1, "error": 5}'],
    [b"REGISTER", b'[{"seq": 1, "req_id": 1, "rows": -2}]', b"id"],
    [b"REGISTER", b'[{"seq": -1, "req_id": 1, "rows": 2}]', b"id"],
    [b"REGISTER", b'[{"seq": "1", "req_id": 1, "rows": 2}]', b"id"],
    # sparse parts: the entries must be what the header says, and well-formed
    _parts({**ONE, "shape": [1, 9], "sparse": 1}, b"\x00" * 24),
    _parts({**ONE, "shape": [1, 9], "sparse": -1}, b"\x00" * 16),
    _parts({**ONE, "shape": [1, 9, 2], "sparse": 0}, b"\x00" * 16),
    _parts({**ONE, "shape": [1, 9], "sparse": 1},
           np.array([0, 1], "<i8").tobytes() + np.array([9], "<i4").tobytes() + np.array([1], "<f4").tobytes()),
], ids=repr)
def test_malformed_frames_raise_message_error(frames):
    with pytest.raises(MessageError):
        messages.decode(frames)


def test_a_publish_names_the_identity_of_its_topic():
    assert messages.Publish([b"client\0", b"{}", b"1"]).identity == b"client"


@pytest.mark.parametrize("frames, job_ids", [
    (_parts({**ONE, "job_id": 7, "shape": [9, 9]}), [7]),
    ([b"PARTS", b'[{"job_id": 8, "nonsense": true}, {"job_id": 9}, {"job_id": -1}, 5]'], [8, 9]),
    ([b"PARTS", b'[{"job_id": true}]', b""], []),
    ([b"PARTS", b"not json", b""], []),
    ([b"PARTS", b"[7]", b""], []),
    ([b"PARTS", b'{"job_id": 7}', b""], []),
    ([b"PARTS"], []),
    ([b"DONE", b'[{"job_id": 7}]'], []),
    ([], []),
], ids=repr)
def test_the_jobs_of_parts_that_failed_to_decode_are_read_when_they_can_be(frames, job_ids):
    assert messages.job_ids_in(frames) == job_ids


def test_budget_is_measured_on_the_receivers_clock_from_receipt():
    job, = messages.decode(messages.Jobs((messages.Job(1, 1, 0, ["x"], budget_ms=500.0),)).frames()).jobs
    for received_at in (-30.0, 0.0, 1e6):  # whatever the receiver's clock reads
        assert not job.spent(received_at, received_at + 0.49)
        assert job.spent(received_at, received_at + 0.5)
    assert not messages.Job(1, 1, 0, ["x"]).spent(0.0, 1e9)  # no budget: the client waits for ever


def test_decode_or_log_names_the_sender_and_the_problem(caplog):
    import logging
    log = logging.getLogger("test-messages")
    assert messages.decode_or_log(messages.Done((3,)).frames(), log, "the sink") == messages.Done((3,))
    with caplog.at_level(logging.WARNING, logger="test-messages"):
        assert messages.decode_or_log([b"DONE", b"x"], log, "the sink") is None
    assert "from the sink" in caplog.text and "malformed DONE" in caplog.text


def test_a_part_header_cannot_name_its_own_array():
    part, = messages.decode(_parts({**ONE, "shape": [2, 1], "array": 5})).parts
    assert isinstance(part.array, np.ndarray) and part.array.shape == (2, 1)
