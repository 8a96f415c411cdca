"""The sink's handling of workers' parts, on its real sockets (its loop is tested in tests/system)."""
import logging
import time

import numpy as np
import pytest
import zmq

from conftest import free_port, short_tmpdir
from encoder_server.server import messages
from encoder_server.server.sink import Sink
from encoder_server.server.sockets import Addresses, waiting
from encoder_server.settings import resolve


@pytest.fixture
def sink(tiny_model, tmp_path):
    context = zmq.Context.instance()
    addresses = Addresses("127.0.0.1", free_port(), free_port(), str(short_tmpdir(tmp_path)))
    feedback = context.socket(zmq.PULL)
    feedback.bind(addresses.feedback)
    sink = Sink(resolve(model=[str(tiny_model)]), addresses, logging.getLogger("test-sink"))
    worker = context.socket(zmq.PUSH)
    worker.connect(addresses.sink)
    yield sink, worker, feedback
    for sock in (worker, feedback, sink.collect, sink.control, sink.publish, sink.feedback):
        sock.close(linger=0)


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
