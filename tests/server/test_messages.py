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
    messages.Job(7, 3, 64, ["a text", "another"], priority=True, is_tokenized=False, with_tokens=True,
                 budget_ms=1234.5, waited_ms=12.0),
    messages.Job(8, 3, 0, [["pre", "split"]], is_tokenized=True),
    messages.Ready(4242, "host-a", remote=True),
    messages.Who(),
    messages.Reset(),
    messages.Heartbeat(Metrics().take()),
    messages.Heartbeat(),
    messages.Dropped(99),
    messages.Done(2 ** 40 + 1),
    messages.Gone(5),
    messages.Forget(5, "texts 0 to 3 made a worker crash twice"),
    messages.Forget(6),
    messages.Register(11, messages.Registration(b"\x00client\xff", 17, rows=300, with_tokens=True)),
    messages.Publish([b"client\0", b'{"dtype": "float32"}', b"\x00" * 8, b"17"]),
    messages.Unread(b"\xffa client", 3),
    messages.BadPart(12, remote=True),
]


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    assert messages.decode(message.frames()) == message


@pytest.mark.parametrize("array, tokens", [(ROWS, None), (TOKEN_LEVEL, [["[CLS]", "a", "[SEP]"]] * 2)])
def test_part_round_trip_as_bytes_and_as_zero_copy_frames(array, tokens):
    part = messages.Part(seq=3, job_id=7, offset=64, array=array, tokens=tokens, num_tokens=6)
    for frames in (part.frames(), [zmq.Frame(bytes(frame)) for frame in part.frames()]):
        decoded = messages.decode(frames)
        assert (decoded.seq, decoded.job_id, decoded.offset, decoded.tokens, decoded.num_tokens) == (3, 7, 64, tokens, 6)
        np.testing.assert_array_equal(decoded.array, array)
        assert decoded.array.dtype == np.float32


def test_a_sparse_part_travels_as_its_entries():
    from encoder_client.sparse import SparseVectors
    rows = SparseVectors.from_dense(np.array([[0, 1.5, 0, 0], [0, 0, 0, 0], [2, 0, 0, -1]], dtype=np.float32))
    part = messages.Part(seq=3, job_id=7, offset=0, array=rows, tokens=[["b"], [], ["a", "d"]])
    frames = part.frames()
    assert len(frames[2]) == 4 * 8 + 3 * 8  # offsets, then an index and a value per entry
    decoded = messages.decode([zmq.Frame(bytes(frame)) for frame in frames])
    assert isinstance(decoded.array, SparseVectors) and decoded.tokens == part.tokens
    np.testing.assert_array_equal(decoded.array.to_dense(), rows.to_dense())


def test_publish_keeps_the_identity_of_its_reply():
    assert messages.decode(messages.Publish([b"who", b"{}", b"1"]).frames()).identity == b"who"


def test_messages_of_one_number_are_told_apart():
    assert messages.decode(messages.Done(1).frames()) != messages.Dropped(1)


def _heartbeat_with(**fields):
    return json.dumps({**Metrics().take(), **fields}).encode()


@pytest.mark.parametrize("frames", [
    [],
    [b"NOPE", b"{}"],
    [b"JOB"],
    [b"JOB", b"not json"],
    [b"JOB", b"[1, 2]"],
    [b"JOB", b'{"job_id": 1}'],
    [b"JOB", b'{"job_id": 1, "seq": 1, "offset": 0, "texts": [], "evil": 1}'],
    [b"JOB", b"[" * 100000 + b"]" * 100000],
    [b"READY", b"\xff\xfe"],
    [b"DONE", b"seven"],
    [b"DONE"],
    [b"FORGET", b"1"],
    [b"REGISTER", b"id"],
    [b"REGISTER", b"id", b'{"req_id": 1, "rows": 2}'],
    [b"PUBLISH"],
    [b"HEARTBEAT", b'{"histograms": [], "tokens": {}, "passes": 1}'],
    [b"HEARTBEAT", b'{"passes": 3}'],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 4]}', b"\x00" * 7],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [3]}', b"\x00" * 8],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0}', b"\x00" * 8],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2]}'],
    # what a hostile peer on an open worker port sent, each of which once ended the ventilator or the sink
    [b"HEARTBEAT", _heartbeat_with(histograms=5)],
    [b"HEARTBEAT", _heartbeat_with(histograms={"batch_rows": 5})],
    [b"HEARTBEAT", _heartbeat_with(histograms={"batch_rows": {"counts": [1], "sum": 0, "count": 1}})],
    [b"HEARTBEAT", _heartbeat_with(passes=-1)],
    [b"HEARTBEAT", _heartbeat_with(tokens={"real": "many", "padded": 0})],
    [b"DROPPED"],
    [b"DROPPED", b"-4"],
    [b"PART", b"not json", b"\x00" * 8],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 1], "dtype": "object"}', b"\x00" * 8],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": -5, "shape": [2, 1]}', b"\x00" * 8],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 1], "num_tokens": "9"}', b"\x00" * 8],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 1], "tokens": [["a"]]}', b"\x00" * 8],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [2, 1, 1, 1]}', b"\x00" * 8],
    [b"JOB", b'{"job_id": 1, "seq": 1, "offset": 0, "texts": "not a list"}'],
    [b"READY", b'{"pid": "1", "host": "h"}'],
    [b"REFUSED", b'{"job_id": 1, "error": 5}'],
    [b"REGISTER", b"id", b'{"seq": 1, "req_id": 1, "rows": -2}'],
    # sparse parts: the entries must be what the header says, and well-formed
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [1, 9], "sparse": 1}', b"\x00" * 24],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [1, 9], "sparse": -1}', b"\x00" * 16],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [1, 9, 2], "sparse": 0}', b"\x00" * 16],
    [b"PART", b'{"seq": 1, "job_id": 1, "offset": 0, "shape": [1, 9], "sparse": 1}',
     np.array([0, 1], "<i8").tobytes() + np.array([9], "<i4").tobytes() + np.array([1], "<f4").tobytes()],
], ids=repr)
def test_malformed_frames_raise_message_error(frames):
    with pytest.raises(MessageError):
        messages.decode(frames)


def test_a_publish_names_the_identity_of_its_topic():
    assert messages.Publish([b"client\0", b"{}", b"1"]).identity == b"client"


@pytest.mark.parametrize("frames, job_id", [
    ([b"PART", b'{"seq": 1, "job_id": 7, "offset": 0, "shape": [9, 9]}', b"\x00" * 8], 7),
    ([b"PART", b'{"job_id": 8, "nonsense": true}'], 8),
    ([b"PART", b'{"job_id": -1}', b""], None),
    ([b"PART", b'{"job_id": true}', b""], None),
    ([b"PART", b"not json", b""], None),
    ([b"PART", b"[7]", b""], None),
    ([b"PART"], None),
    ([b"DONE", b'{"job_id": 7}'], None),
    ([], None),
], ids=repr)
def test_the_job_of_a_part_that_failed_to_decode_is_read_when_it_can_be(frames, job_id):
    assert messages.job_id_in(frames) == job_id


def test_budget_is_measured_on_the_receivers_clock_from_receipt():
    job = messages.decode(messages.Job(1, 1, 0, ["x"], budget_ms=500.0).frames())
    for received_at in (-30.0, 0.0, 1e6):  # whatever the receiver's clock reads
        assert not job.spent(received_at, received_at + 0.49)
        assert job.spent(received_at, received_at + 0.5)
    assert not messages.Job(1, 1, 0, ["x"]).spent(0.0, 1e9)  # no budget: the client waits for ever


def test_decode_or_log_names_the_sender_and_the_problem(caplog):
    import logging
    log = logging.getLogger("test-messages")
    assert messages.decode_or_log(messages.Done(3).frames(), log, "the sink") == messages.Done(3)
    with caplog.at_level(logging.WARNING, logger="test-messages"):
        assert messages.decode_or_log([b"DONE", b"x"], log, "the sink") is None
    assert "from the sink" in caplog.text and "malformed DONE" in caplog.text
