"""CURVE on the public ports: only authorized clients get in, the server's own workers and gateway
use its key, and an identity belongs to the first key that uses it."""
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from conftest import free_port, random_texts, running_server, wait_for
from encoder_client import EncoderClient, IdentityRefusedError

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    for name, where in (("server", "server"), ("alice", "authorized"), ("mallory", "strangers")):
        subprocess.run([sys.executable, "-m", "encoder_server.cli", "keygen", str(folder / where), "--name", name],
                       check=True, capture_output=True)
    return folder


def test_curve_admits_authorized_clients_only(tiny_model, tmp_path, keys):
    server_public = keys / "server" / "server.key"
    alice = {"server_key": str(server_public), "client_key": str(keys / "authorized" / "alice.key_secret")}
    with running_server(tiny_model, "--server-key", str(keys / "server" / "server.key_secret"),
                        "--authorized-clients", str(keys / "authorized"), tmp_path=tmp_path,
                        client_keys=alice) as server:
        port_args = ("127.0.0.1", server.port, server.port_out)
        strangers = zmq.Context()  # raw sockets of their own, torn down with their context
        eavesdropper = strangers.socket(zmq.SUB)
        eavesdropper.setsockopt(zmq.SUBSCRIBE, b"")
        eavesdropper.curve_serverkey = zmq.auth.load_certificate(str(server_public))[0]
        eavesdropper.curve_publickey, eavesdropper.curve_secretkey = zmq.auth.load_certificate(
            str(keys / "strangers" / "mallory.key_secret"))
        eavesdropper.connect(f"tcp://127.0.0.1:{server.port_out}")
        plain = strangers.socket(zmq.SUB)
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        plain.connect(f"tcp://127.0.0.1:{server.port_out}")

        with server.client(timeout=20) as authorized:
            assert authorized.encode(random_texts(10)).shape == (10, 32)
            config = authorized.server_config
            assert config["curve"] and config["clients_authenticated"]
            assert not any(str(keys) in str(value) for value in config.values())
        with pytest.raises((PermissionError, TimeoutError)):
            EncoderClient(*port_args, timeout=3, server_key=str(server_public),
                          client_key=str(keys / "strangers" / "mallory.key_secret"))
        with pytest.raises((PermissionError, TimeoutError)):
            EncoderClient(*port_args, timeout=3)  # no CURVE at all, so it cannot even stop the server
        for sock in (eavesdropper, plain):
            assert not sock.poll(500), "an unauthorized subscriber received something"
        strangers.destroy(linger=0)
        assert server.status()["ready"]


def test_curve_server_key_admits_its_own_workers_and_gateway(tiny_model, tmp_path, keys):
    """With worker ports open, local workers and the built-in gateway connect with the server's
    own key, which --authorized-clients need not list."""
    import httpx

    alice = {"server_key": str(keys / "server" / "server.key"),
             "client_key": str(keys / "authorized" / "alice.key_secret")}
    http_port = free_port()
    with running_server(tiny_model, "--server-key", str(keys / "server" / "server.key_secret"),
                        "--authorized-clients", str(keys / "authorized"),
                        "--worker-port", str(free_port(consecutive=2)),
                        "--http-port", str(http_port), "--num-worker", "2", tmp_path=tmp_path,
                        client_keys=alice) as server:
        texts = random_texts(40, seed=3)
        with server.client(timeout=20) as client:
            expected = client.encode(texts)
        wait_for(lambda: _http_ready(http_port), timeout=30)
        reply = httpx.post(f"http://127.0.0.1:{http_port}/encode", json={"id": 7, "texts": texts}, timeout=30)
        assert reply.status_code == 200, reply.text
        np.testing.assert_allclose(np.array(reply.json()["result"], dtype=np.float32), expected, atol=1e-6)


def _http_ready(port):
    import httpx

    try:
        return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_curve_binds_an_identity_to_the_first_key_that_uses_it(tiny_model, tmp_path, keys):
    """Two authorized clients: bob may neither read alice's replies nor send requests as her."""
    subprocess.run([sys.executable, "-m", "encoder_server.cli", "keygen", str(keys / "authorized"), "--name", "bob"],
                   check=True, capture_output=True)
    server_public = str(keys / "server" / "server.key")
    as_alice = {"server_key": server_public, "client_key": str(keys / "authorized" / "alice.key_secret")}
    as_bob = {"server_key": server_public, "client_key": str(keys / "authorized" / "bob.key_secret")}
    with running_server(tiny_model, "--server-key", str(keys / "server" / "server.key_secret"),
                        "--authorized-clients", str(keys / "authorized"), tmp_path=tmp_path,
                        client_keys=as_alice) as server:
        with server.client(identity="alice-desk", timeout=20) as alice:
            assert alice.encode(random_texts(5)).shape == (5, 32)
            started = time.monotonic()
            with pytest.raises(IdentityRefusedError, match="refused this client's identity: it belongs to another"):
                server.client(identity="alice-desk", timeout=10, **as_bob)  # the sink says so at once
            assert time.monotonic() - started < 2.0
            context = zmq.Context()
            try:
                impostor = context.socket(zmq.PUSH)
                impostor.curve_serverkey = zmq.auth.load_certificate(server_public)[0]
                impostor.curve_publickey, impostor.curve_secretkey = zmq.auth.load_certificate(
                    as_bob["client_key"])
                impostor.connect(f"tcp://127.0.0.1:{server.port}")
                impostor.send_multipart([b"alice-desk", b'["forged"]', b"1", b"1"])
                time.sleep(1)
            finally:
                context.destroy(linger=0)
            assert alice.encode(random_texts(5)).shape == (5, 32)
            with server.client(identity="bob-desk", timeout=20, **as_bob) as bob:
                assert bob.encode(random_texts(3)).shape == (3, 32)
    assert "belongs to another client key" in server.log
