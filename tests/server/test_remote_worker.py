"""Workers on another host: `encoder-server start --worker-port P` and `encoder-server worker --connect`.

The "other host" is a network namespace of its own on this machine, joined to the root namespace
by a veth pair: the server and the test's clients live at 10.233.N.1, the remote worker at
10.233.N.2, so every job and result crosses a real (virtual) link. Faults come from the test-only
hook in encoder_server.server.fault_injection, switched on in the remote worker alone.
"""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth

from conftest import (RunningServer, free_port, group_alive, random_texts, running_server, settled_status,
                      wait_for)
from encoder_client import EncoderClient
from encoder_server.server import messages

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[2]
JOIN_TIMEOUT = 90


# ----- the second host -----

def _ip(*args, check=True):
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode:
        raise RuntimeError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _forbidden(result):
    text = result.stderr.lower()
    return any(why in text for why in ("operation not permitted", "permission denied", "not supported",
                                       "unknown device type"))


class Namespace:
    """A network namespace joined to ours by a veth pair: we are `host` (.1), it is `peer` (.2)."""

    def __init__(self):
        pid = os.getpid()
        self.name = f"encsrv-test-{pid}"
        self.veth, self.veth_peer = f"esv{pid}r"[:15], f"esv{pid}n"[:15]
        taken = _ip("-o", "-4", "addr", "show", check=False).stdout
        subnets = [n for n in range(256) if f"10.233.{n}." not in taken]
        net = random.Random(pid).choice(subnets)
        self.host, self.peer = f"10.233.{net}.1", f"10.233.{net}.2"

    def create(self):
        veth = _ip("link", "add", self.veth, "type", "veth", "peer", "name", self.veth_peer, "netns", self.name,
                   check=False)
        if veth.returncode and _forbidden(veth):
            pytest.skip(f"this kernel/sandbox forbids veth pairs: {veth.stderr.strip()}")
        elif veth.returncode:
            raise RuntimeError(f"ip link add {self.veth} type veth failed: {veth.stderr.strip()}")
        _ip("addr", "add", f"{self.host}/30", "dev", self.veth)
        _ip("link", "set", self.veth, "up")
        _ip("-n", self.name, "addr", "add", f"{self.peer}/30", "dev", self.veth_peer)
        _ip("-n", self.name, "link", "set", self.veth_peer, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")

    def delete(self):
        _ip("link", "del", self.veth, check=False)  # takes its peer with it
        _ip("netns", "del", self.name, check=False)


@pytest.fixture(scope="module")
def netns():
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is missing, so no second network namespace can be made")
    space = Namespace()
    added = _ip("netns", "add", space.name, check=False)
    if added.returncode:
        if _forbidden(added):
            pytest.skip(f"this kernel/sandbox forbids network namespaces: {added.stderr.strip()}")
        raise RuntimeError(f"ip netns add {space.name} failed: {added.stderr.strip()}")
    try:
        space.create()
        yield space
    finally:
        space.delete()
    assert space.name not in _ip("netns", "list").stdout, f"netns {space.name} outlived the tests"


@pytest.fixture
def on_veth(netns, monkeypatch):
    """Servers bound on the veth address: conftest's RunningServer (its readiness wait included)
    reaches them there instead of on 127.0.0.1, for this test only."""
    def client(server, **kwargs):
        kwargs.setdefault("timeout", 60)
        return EncoderClient(netns.host, server.port, server.port_out, **{**server.client_keys, **kwargs})

    monkeypatch.setattr(RunningServer, "client", client)
    return netns


class RemoteWorker:
    def __init__(self, process, log_path):
        self.process, self.log_path = process, log_path

    @property
    def log(self):
        return Path(self.log_path).read_text(errors="replace")

    def owns(self, worker_name):
        """Whether `worker_name` (HOST/worker-i:PID) is one of this command's worker processes."""
        try:
            return os.getpgid(int(worker_name.rsplit(":", 1)[1])) == self.process.pid
        except (ProcessLookupError, ValueError):
            return False

    def kill(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(30)


@pytest.fixture
def remote_worker(netns, tiny_model, tmp_path, keys):
    """start(server, *flags, env=...) runs `encoder-server worker` inside the namespace, with an
    authorized key unless `flags` name others; every worker started is killed, process group and
    all, at the end of the test."""
    started = []

    def start(server, *flags, env=None, name="worker"):
        tmpdir = tmp_path / f"{name}-tmp"
        tmpdir.mkdir(exist_ok=True)
        log_path = tmp_path / f"{name}.log"
        command = ["ip", "netns", "exec", netns.name, sys.executable, "-m", "encoder_server.cli", "worker",
                   "--connect", netns.host, "--port", str(server.port), "--port-out", str(server.port_out),
                   "--model", str(tiny_model), "--num-worker", "1", "--threads-per-worker", "1",
                   "--server-key", str(keys / "server.key"), "--client-key", str(keys / "clients" / "worker.key_secret"),
                   *flags]
        with open(log_path, "w") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                       cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmpdir),
                                                      "ENCODER_SERVER_CACHE": os.environ["ENCODER_SERVER_CACHE"],
                                                      **(env or {})})
        worker = RemoteWorker(process, log_path)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()
        deadline = time.monotonic() + 10  # killed children linger as zombies until they are reaped
        while any(group_alive(worker.process.pid) for worker in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        for worker in started:
            assert not group_alive(worker.process.pid), f"remote worker outlived its kill:\n{worker.log}"


# ----- helpers -----

def worker_port():
    """A port whose successor is free too (jobs on it, results on the next)."""
    return free_port(consecutive=2)


def status(server):
    with server.client(timeout=10) as probe:
        return probe.server_status


def settled(server):
    with server.client(timeout=10) as probe:
        return settled_status(probe)


def wait_joined(server, worker):
    """Wait until one of `worker`'s processes has joined the server; returns (its name, status)."""
    deadline = time.monotonic() + JOIN_TIMEOUT
    while True:
        assert worker.process.poll() is None, f"remote worker exited with {worker.process.returncode}:\n{worker.log}"
        state = status(server)
        names = [name for name in state["worker_busy_texts"] if "/worker-" in name and worker.owns(name)]
        if names:
            return names[0], state
        assert time.monotonic() < deadline, f"remote worker never joined; status {state}\n{worker.log}"
        time.sleep(0.2)


def server_flags(netns, port, keys, *more):
    """A server on the veth address: its worker port is open beyond loopback, so it needs CURVE."""
    return ("--host", netns.host, "--worker-port", str(port), "--num-worker", "1", "--threads-per-worker", "1",
            "--server-key", str(keys / "server.key_secret"), "--authorized-clients", str(keys / "clients"), *more)


def as_alice(keys):
    """The client keys of an authorized client."""
    return {"server_key": str(keys / "server.key"), "client_key": str(keys / "clients" / "alice.key_secret")}


# ----- tests -----

def test_a_remote_worker_makes_its_own_compute_choices_and_takes_the_servers_model_choices(tiny_model):
    """worker_settings, from a server's SHOW_CONFIG and this host's flags: CUDA graphs and tokenizing
    threads are this host's choice (graphs on cpu: off by default, and asking for them is a clear
    error), the pooling the server's."""
    from encoder_server.cli import _parser
    from encoder_server.model.model_folder import ConfigError
    from encoder_server.server.remote_worker import worker_settings
    from encoder_server.settings import resolve
    config = {**resolve(model=str(tiny_model), pooling_strategy="max").public_config(), "worker_port": 5999}

    def settings(*flags):
        return worker_settings(config, _parser().parse_args(["worker", "--connect", "10.0.0.1", "--model",
                                                             str(tiny_model), *flags]))
    assert settings().cuda_graphs is False and settings().pooling_strategy == "max"
    assert settings("--no-cuda-graphs").cuda_graphs is False
    config["tokenizer_threads"] = 5  # the server's own: not this host's
    assert settings().tokenizer_threads == 1 and settings("--tokenizer-threads", "3").tokenizer_threads == 3
    with pytest.raises(ConfigError, match="--cuda-graphs needs --device cuda and --backend torch"):
        settings("--cuda-graphs")


def test_remote_worker_joins_shares_the_work_and_computes_the_same_rows(tiny_model, tmp_path, on_veth, remote_worker,
                                                                       keys):
    texts = random_texts(3000, seed=41, min_words=3, max_words=40)
    # pooling other than the folder's defaults: the remote worker must take the server's from SHOW_CONFIG
    with running_server(tiny_model, *server_flags(on_veth, worker_port(), keys, "--pooling-strategy", "max",
                                                  "--pooling-layer", "-1", "--normalize"),
                        tmp_path=tmp_path, client_keys=as_alice(keys)) as server:
        with server.client() as alone:
            before = alone.encode(texts)
        state = status(server)
        assert state["workers_alive"] == 1 and not any("/worker-" in name for name in state["worker_busy_texts"])

        worker = remote_worker(server)
        name, state = wait_joined(server, worker)
        assert state["workers_alive"] == 2, state
        assert name.startswith(f"{socket.gethostname()}/worker-0:"), name
        pid = int(name.rsplit(":", 1)[1])
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net"), \
            "the remote worker is not in the other network namespace"
        assert "joining" in worker.log and on_veth.host in worker.log, worker.log

        with server.client() as shared:
            after = shared.encode(texts)
        assert after.shape == before.shape == (3000, 32)
        assert np.allclose(after, before, atol=1e-5), f"max difference {np.abs(after - before).max()}"
        state = settled(server)
        assert state["workers_alive"] == 2
        encoded = state["worker_texts_encoded"]
        assert encoded.get(name, 0) > 0, f"the remote worker encoded nothing: {encoded}\n{worker.log}"
        assert sum(encoded.values()) == 2 * len(texts), encoded  # alone, then shared
        assert worker.process.poll() is None, worker.log


def test_losing_a_remote_worker_mid_request_loses_no_row(tiny_model, tmp_path, on_veth, remote_worker, keys):
    texts = random_texts(3000, seed=42, min_words=3, max_words=40)
    for index in range(0, len(texts), 64):  # the first text of every bulk job (64 texts, the default)
        texts[index] = "!sleep 2"  # stalls a faulty worker's intake: the remote one is caught holding jobs
    with running_server(tiny_model, *server_flags(on_veth, worker_port(), keys), tmp_path=tmp_path,
                        client_keys=as_alice(keys)) as server:
        with server.client() as alone:
            reference = alone.encode(texts)  # the server's own worker has no faults: plain text to it
        worker = remote_worker(server, env={"ENCODER_SERVER_FAULTS": "1"})
        name, state = wait_joined(server, worker)
        assert state["workers_alive"] == 2, state

        with server.client() as victim:
            victim.encode(texts, blocking=False)
            deadline = time.monotonic() + 30
            while status(server)["worker_busy_texts"].get(name, 0) == 0:
                assert time.monotonic() < deadline, f"the remote worker never got a job:\n{worker.log}"
                time.sleep(0.02)
            held = status(server)["worker_busy_texts"].get(name, 0)
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait(10)
            result = victim.fetch_all(concat=True)

        assert result.shape == reference.shape, worker.log
        assert np.allclose(result, reference, atol=1e-5), f"max difference {np.abs(result - reference).max()}"
        wait_for(lambda: status(server)["workers_alive"] == 1, timeout=15)
        state = status(server)
        assert name not in state["worker_busy_texts"] and state["ready"], state
        assert held > 0 and state["jobs_redispatched"] >= 1, (held, state)
        assert state["in_flight_requests"] == 0 and state["requests"]["failed"] == 0, state


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    for name, where in (("server", "."), ("alice", "clients"), ("worker", "clients"), ("mallory", "strangers")):
        subprocess.run([sys.executable, "-m", "encoder_server.cli", "keygen", str(folder / where), "--name", name],
                       check=True, capture_output=True)
    return folder


def _intruder(context, endpoint, identity, keys=None):
    """A raw DEALER that says READY on the worker port, with `keys` (server public, own pair) or none;
    the test keeps it heartbeating, so were it let in it would stay in."""
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.LINGER, 0)
    if keys:
        sock.curve_serverkey, (sock.curve_publickey, sock.curve_secretkey) = keys[0], keys[1]
    sock.connect(endpoint)
    sock.send_multipart(messages.Ready(os.getpid(), "intruder", True).frames())
    return sock


def test_curve_worker_ports_admit_authorized_workers_only(tiny_model, tmp_path, on_veth, remote_worker, keys):
    server_public = keys / "server.key"
    port = worker_port()
    texts = random_texts(1000, seed=43, min_words=3, max_words=40)
    with running_server(tiny_model, *server_flags(on_veth, port, keys), tmp_path=tmp_path,
                        client_keys=as_alice(keys)) as server:
        with server.client() as authorized:
            reference = authorized.encode(texts)
            config = authorized.server_config
        assert config["curve"] and config["clients_authenticated"] and config["worker_port"] == port

        stranger = remote_worker(server, "--server-key", str(server_public), "--client-key",
                                 str(keys / "strangers" / "mallory.key_secret"), "--timeout", "60", name="stranger")
        trusted = remote_worker(server, "--server-key", str(server_public), "--client-key",
                                str(keys / "clients" / "worker.key_secret"), name="trusted")
        name, _ = wait_joined(server, trusted)
        with server.client() as authorized:
            shared = authorized.encode(texts)
        assert np.allclose(shared, reference, atol=1e-5), f"max difference {np.abs(shared - reference).max()}"
        assert settled(server)["worker_texts_encoded"].get(name, 0) > 0, trusted.log

        # and straight at the worker port, past `encoder-server worker`'s own checks
        context = zmq.Context()
        try:
            server_key = zmq.auth.load_certificate(str(server_public))[0]
            mallory = zmq.auth.load_certificate(str(keys / "strangers" / "mallory.key_secret"))
            endpoint = f"tcp://{on_veth.host}:{port}"
            intruders = [_intruder(context, endpoint, b"intruder/worker-0:1", (server_key, mallory)),
                         _intruder(context, endpoint, b"intruder/worker-1:1")]
            watched_until = time.monotonic() + 8
            while time.monotonic() < watched_until:
                for sock in intruders:
                    try:
                        sock.send_multipart(messages.Heartbeat().frames(), flags=zmq.NOBLOCK)
                    except zmq.Again:
                        pass
                state = status(server)
                workers = state["worker_busy_texts"]
                assert not any(stranger.owns(other) or other.startswith("intruder") for other in workers), \
                    f"an unauthorized worker joined: {workers}\n{stranger.log}\n{server.log}"
                assert state["workers_alive"] == 2 and name in workers, \
                    f"{state}\nstranger:\n{stranger.log}\ntrusted:\n{trusted.log}\nserver:\n{server.log}"
                time.sleep(0.5)
            for sock in intruders:
                assert not sock.poll(100), "an unauthorized worker socket received something"
        finally:
            context.destroy(linger=0)
        assert "joining" not in stranger.log, stranger.log
        joined = [line for line in server.log.splitlines() if "/worker-" in line and " ready (" in line]
        assert len(joined) == 1 and name in joined[0], joined  # the trusted worker alone, ever
        assert stranger.process.poll() in (None, 1), stranger.log  # still waiting, or gave up with an error

        trusted.kill()
        wait_for(lambda: status(server)["workers_alive"] == 1, timeout=15)
        with server.client() as authorized:  # the server keeps serving on its own
            assert np.allclose(authorized.encode(texts), reference, atol=1e-5)


def test_remote_worker_joins_again_after_the_server_restarts(tiny_model, tmp_path_factory, on_veth, remote_worker,
                                                             keys):
    """The worker says READY anew: when the new ventilator asks who it is, or when it stops hearing heartbeats."""
    ports, port = (free_port(), free_port()), worker_port()
    texts = random_texts(500, seed=44, min_words=3, max_words=40)
    with running_server(tiny_model, *server_flags(on_veth, port, keys), tmp_path=tmp_path_factory.mktemp("r"),
                        ports=ports, client_keys=as_alice(keys)) as first:
        with first.client() as client:
            reference = client.encode(texts)
        worker = remote_worker(first)
        wait_joined(first, worker)
    with running_server(tiny_model, *server_flags(on_veth, port, keys), tmp_path=tmp_path_factory.mktemp("r"),
                        ports=ports, client_keys=as_alice(keys)) as second:
        name, state = wait_joined(second, worker)
        assert state["workers_alive"] == 2, state
        with second.client() as client:
            assert np.allclose(client.encode(texts), reference, atol=1e-5)
        assert settled(second)["worker_texts_encoded"].get(name, 0) > 0, worker.log
    assert "saying READY again" in worker.log or "connecting again" in worker.log, worker.log
