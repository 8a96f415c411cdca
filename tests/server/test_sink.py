"""The sink's handling of workers' parts, on its real sockets (its loop is tested in tests/system)."""
import logging
import time

import numpy as np
import pytest
import zmq

from conftest import free_port, short_tmpdir
from encoder_client.protocol import CHUNK_BYTES
from encoder_server.server import messages
from encoder_server.server.sink import Sink
from encoder_server.server.sockets import Addresses, waiting
from encoder_server.settings import resolve


def open_sink(model, tmp_path, **settings):
    """(a Sink on fresh addresses, the PULL that takes its feedback as the ventilator's does, the addresses)."""
    addresses = Addresses("127.0.0.1", free_port(), free_port(), str(short_tmpdir(tmp_path)))
    feedback = zmq.Context.instance().socket(zmq.PULL)
    feedback.bind(addresses.feedback)
    return Sink(resolve(model=[str(model)], **settings), addresses, logging.getLogger("test-sink")), feedback, addresses


def close(sink, *others):
    for sock in (*others, sink.collect, sink.control, sink.publish, sink.feedback):
        sock.close(linger=0)


@pytest.fixture
def sink(tiny_model, tmp_path):
    sink, feedback, addresses = open_sink(tiny_model, tmp_path)
    worker = zmq.Context.instance().socket(zmq.PUSH)
    worker.connect(addresses.sink)
    yield sink, worker, feedback
    close(sink, worker, feedback)


def parts(job_id, width=32):
    part = messages.Part(seq=job_id, job_id=job_id, offset=0, array=np.ones((1, width), np.float32), num_tokens=3)
    return messages.Parts((part,)).frames()


def test_the_parts_that_one_turn_takes_are_reported_in_one_done(sink):
    """Three workers' messages taken in one turn: one DONE names all their jobs, so the ventilator
    reads one message where it read three."""
    sink, worker, feedback = sink
    for job_id in (7, 8, 9):
        worker.send_multipart(parts(job_id))
    assert sink.collect.poll(5000)
    time.sleep(0.2)  # all three on the sink's side of the connection
    sink.on_parts(waiting(sink.collect, copy=False))
    assert feedback.poll(5000)
    assert messages.decode(feedback.recv_multipart()) == messages.Done((7, 8, 9))
    assert not feedback.poll(200), "a second DONE"


def test_a_bad_message_among_them_is_reported_alone_and_the_others_done(sink):
    sink, worker, feedback = sink
    worker.send_multipart(parts(7))
    worker.send_multipart(parts(8, width=5))  # no served model's width
    assert sink.collect.poll(5000)
    time.sleep(0.2)
    sink.on_parts(waiting(sink.collect, copy=False))
    received = [messages.decode(feedback.recv_multipart()) for _ in range(2) if feedback.poll(5000)]
    assert received == [messages.BadPart(8, False), messages.Done((7,))]


@pytest.mark.parametrize("budget, chunk", [({}, CHUNK_BYTES), ({"max_result_mb": 1, "max_unread_mb": 2}, 256 << 10)],
                         ids=["default", "small-budget"])
def test_results_are_streamed_in_chunks_of_at_most_an_eighth_of_a_readers_budget(tiny_model, tmp_path, budget, chunk):
    """A reader a few chunks behind must never be past its --max-unread-mb for their size alone."""
    sink, feedback, _ = open_sink(tiny_model, tmp_path, **budget)
    try:
        assert sink.chunk_bytes == chunk
    finally:
        close(sink, feedback)
