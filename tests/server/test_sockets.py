import subprocess
import sys
import textwrap
import time

import pytest
import zmq

from conftest import free_port
from encoder_server.server.sockets import peer_address, waiting

# a process that queues one message for a peer not there yet, says so, and exits
SENDER = textwrap.dedent("""
    import sys
    import zmq
    from encoder_server.server.sockets import LINGER_MS, let_queued_messages_out
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.connect(sys.argv[1])
    sock.send(b"the last reply")
    sock.close(linger=LINGER_MS)
    print("queued", flush=True)
    if sys.argv[2] == "let out":
        let_queued_messages_out()
""")


def last_message_of_an_exiting_process(tmp_path, ending):
    endpoint = f"ipc://{tmp_path}/peer"
    sender = subprocess.Popen([sys.executable, "-c", SENDER, endpoint, ending], stdout=subprocess.PIPE, text=True)
    try:
        assert sender.stdout.readline() == "queued\n"
        if ending == "just exit":
            sender.wait(10)
        peer = zmq.Context.instance().socket(zmq.PULL)
        peer.bind(endpoint)
        try:
            return peer.recv() if peer.poll(1500) else None
        finally:
            peer.close(linger=0)
    finally:
        assert sender.wait(10) == 0


def test_a_stopping_process_lets_its_queued_messages_out(tmp_path):
    """A process that ends its context waits for a late peer to take what it queued; one that just
    exits loses it (pyzmq does not end the context at exit, so the socket's linger never applies)."""
    assert last_message_of_an_exiting_process(tmp_path, "let out") == b"the last reply"
    assert last_message_of_an_exiting_process(tmp_path, "just exit") is None


@pytest.mark.parametrize("copy", [True, False])
def test_waiting_takes_whole_messages_as_they_were_sent_up_to_its_limit(tmp_path, copy):
    """Each message whole, frames in order (a one-frame one too), at most `limit` a call, and none
    lost between calls."""
    context = zmq.Context.instance()
    with context.socket(zmq.PULL) as pull, context.socket(zmq.PUSH) as push:
        pull.setsockopt(zmq.RCVTIMEO, 5000)
        pull.bind(f"ipc://{tmp_path}/waiting")
        push.connect(f"ipc://{tmp_path}/waiting")
        sent = [[b"one"], [b"a", b"", b"c" * 100_000], [b"x", b"y"], [b"last", b"of", b"four", b"frames"]]
        for message in sent:
            push.send_multipart(message)
        assert pull.poll(5000)
        time.sleep(0.2)  # every message in, so that `limit` and not their arrival ends the first call

        first, second, third = (list(waiting(pull, copy=copy, limit=3)) for _ in range(3))
        assert [[frame if copy else frame.bytes for frame in message] for message in first + second] == sent
        assert len(first) == 3 and third == []
        assert all(isinstance(frame, bytes if copy else zmq.Frame) for message in first + second for frame in message)


def test_a_peer_address_is_an_ip_over_tcp_and_none_over_ipc(tmp_path):
    """The sink tells a local worker's parts (ipc) from a remote one's (tcp) by it: ZeroMQ gives an
    ipc peer "localhost:UID:GID:PID", which once made every local worker's junk part look forged."""
    context = zmq.Context.instance()
    port = free_port()
    for endpoint, expected in ((f"ipc://{tmp_path}/peer", None), (f"tcp://127.0.0.1:{port}", "127.0.0.1")):
        with context.socket(zmq.PULL) as pull, context.socket(zmq.PUSH) as push:
            pull.bind(endpoint)
            push.connect(endpoint)
            push.send(b"who is it")
            assert pull.poll(5000)
            assert peer_address(pull.recv(copy=False)) == expected
