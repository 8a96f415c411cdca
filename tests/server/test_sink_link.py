"""The ventilator's link to the sink, on real sockets: a sink that takes nothing loses nothing."""
import pytest
import zmq

from conftest import short_tmpdir
from encoder_server.server import messages
from encoder_server.server.sink_link import SinkLink


@pytest.fixture
def endpoint(tmp_path):
    return f"ipc://{short_tmpdir(tmp_path)}/control"


def stalled_push(endpoint):
    """A PUSH with nobody at `endpoint`, which takes no message (IMMEDIATE: it queues none for a
    peer it has not met), as the ventilator's does while the sink restarts."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def registration(req_id):
    return messages.Registration(b"client", req_id, 1, False, False, 8, None, False)


def received(pull, count):
    return [messages.decode(pull.recv_multipart()) for _ in range(count) if pull.poll(5000)]


def test_messages_wait_in_order_until_the_sink_takes_them_registrations_first(endpoint):
    link = SinkLink(stalled_push(endpoint))
    link.register(1, registration(11))
    link.send(messages.Forget(1, "", "").frames())
    link.register(2, registration(12))
    link.publish([b"client\x00", b"{}", b"12"])
    assert link.behind and len(link.unsent) == 4
    pull = zmq.Context.instance().socket(zmq.PULL)
    pull.bind(endpoint)
    try:
        for _ in range(500):  # until the PUSH has met its peer
            link.send()
            if not link.behind:
                break
            pull.poll(10)
        assert not link.behind
        assert received(pull, 4) == [messages.Register({1: registration(11)}), messages.Forget(1, "", ""),
                                     messages.Register({2: registration(12)}),
                                     messages.Publish([b"client\x00", b"{}", b"12"])]
    finally:
        pull.close(linger=0)
        link.sock.close(linger=0)


def test_the_link_is_full_at_its_limit(endpoint):
    link = SinkLink(stalled_push(endpoint), limit=3)
    for seq in range(2):
        link.send(messages.Forget(seq, "", "").frames())
    assert link.behind and not link.full
    link.send(messages.Forget(2, "", "").frames())
    assert link.full
    link.sock.close(linger=0)
