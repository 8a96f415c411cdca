"""The engines under test, each started the same way it would run for a user.

Servers (our service, infinity) run as separate process trees whose peak RSS is sampled. Each
engine gives `client()`: a fresh object with `encode(texts) -> None`, one per concurrent user.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from encoder_server.ports import free_port  # noqa: F401 (the benchmarks take it from here)

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 300


class RssSampler:
    """Peak memory of a process and its children, sampled every 0.2 s: the sum of their RSS, which
    counts pages they share (libraries, the mapped ONNX weights) once per process, and the sum of
    their PSS, which splits each shared page between its sharers and so adds up to what the group
    costs the machine."""

    def __init__(self, pid):
        self.root = psutil.Process(pid)
        self.peak_mb = self.peak_pss_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(0.2):
            try:
                tree = [self.root, *self.root.children(recursive=True)]
                rss = sum(process.memory_info().rss for process in tree)
                pss = sum(_pss(process.pid) for process in tree)
            except (psutil.Error, OSError):
                continue
            self.peak_mb = max(self.peak_mb, rss / 2**20)
            self.peak_pss_mb = max(self.peak_pss_mb, pss / 2**20)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return round(self.peak_mb, 1)


def _pss(pid):
    """Proportional set size in bytes, from /proc/PID/smaps_rollup (Linux 4.14+)."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        return next(int(line.split()[1]) * 1024 for line in rollup if line.startswith("Pss:"))


class Server:
    """A server process group: started in __enter__, ready-checked, stopped in __exit__. Its output goes
    to `log_path`; without a log folder, to a temporary file that is removed unless the start failed."""
    name = "server"
    last_probe = None  # what the last readiness check saw that was not ready, for the error if none passes

    def _place_log(self, log_dir, name):
        """Set `log_path`: NAME.log in `log_dir`, or without one a temporary file."""
        self._temporary_log = log_dir is None
        if log_dir is None:
            descriptor, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".log")
            os.close(descriptor)
            self.log_path = Path(path)
        else:
            self.log_path = Path(log_dir) / f"{name}.log"

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
                                        env=self.env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self._temporary_log = False
                seen = [self.last_probe, self.diagnosis() if self.process.poll() is None else None]
                self.__exit__()
                last = f" (the last probe: {'; '.join(filter(None, seen))})" if any(seen) else ""
                raise RuntimeError(f"{self.name} did not start{last}; see {self.log_path}")
            time.sleep(0.05)
        self.rss = RssSampler(self.process.pid)
        return self

    def diagnosis(self):
        """What more can be learned of a server that runs but never got ready (None: nothing)."""
        return None

    def __exit__(self, *_):
        self.peak_rss_mb = self.rss.stop() if hasattr(self, "rss") else None
        self.peak_pss_mb = round(self.rss.peak_pss_mb, 1) if hasattr(self, "rss") else None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()
        if self._temporary_log:
            self.log_path.unlink(missing_ok=True)


def start_command(port, port_out, model=None, flags=()):
    """`encoder-server start` on these ports, with `model` (None: the bundled one) and more flags."""
    return [sys.executable, "-m", "encoder_server.cli", "start", "--port", str(port), "--port-out", str(port_out),
            *(["--model", str(model)] if model else []), *flags]


class Service(Server):
    """`encoder-server start` with the given flags."""

    def __init__(self, name, flags=(), model=None, log_dir=None, env=None):
        self.name = name
        self.port, self.port_out = free_port(), free_port()
        self.command = start_command(self.port, self.port_out, model, flags)
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
        self._place_log(log_dir, f"bench-{self.port}")

    def ready(self):
        from encoder_client import EncoderClient
        try:
            with EncoderClient("127.0.0.1", self.port, self.port_out, timeout=1) as probe:
                status = probe.server_status
        except TimeoutError as error:
            self.last_probe = f"{error} (TCP: {tcp_reachability(self.port)} on {self.port}, " \
                              f"{tcp_reachability(self.port_out)} on {self.port_out})"
            return False
        if not status["ready"]:
            self.last_probe = (f"answered, not ready: {status['workers_alive']} of {status['workers_expected']} "
                               f"workers alive, {status['workers_remote']} of them remote")
        return status["ready"]

    def diagnosis(self):
        """Whether a client in a process of its own (`encoder-server status`) gets an answer: it tells
        a server that answers no one from a fault in this process's own ZeroMQ state."""
        command = [sys.executable, "-m", "encoder_server.cli", "status", "--host", "127.0.0.1",
                   "--port", str(self.port), "--port-out", str(self.port_out)]
        try:
            result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return "a client in a process of its own: no answer within 30 s"
        try:
            status = json.loads(result.stdout)
            said = str({key: status.get(key) for key in ("ready", "workers_alive", "in_flight_requests")})
        except ValueError:  # no answer: the command says why on stderr
            said = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        return f"a client in a process of its own: {said}"

    def client(self):
        from encoder_client import EncoderClient
        return _ServiceClient(EncoderClient("127.0.0.1", self.port, self.port_out, timeout=900))


def tcp_reachability(port, host="127.0.0.1"):
    """Whether `port` takes a TCP connection, in words: it tells a server that is not listening, or
    a connection that goes elsewhere, from one that is reached but does not answer."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return "connects"
    except OSError as error:
        return error.strerror or type(error).__name__  # a timeout has no strerror


class _ServiceClient:
    def __init__(self, client):
        self._client = client

    def encode(self, texts):
        self._client.encode(texts)

    def close(self):
        self._client.close()


class Infinity(Server):
    """infinity-emb's own server (`infinity_emb v2 --engine torch --device cpu`), driven over HTTP."""

    def __init__(self, executable, model, log_dir=None):
        self.name = "infinity (torch, fp32)"
        self.port = free_port()
        self.command = [str(executable), "v2", "--model-id", str(model), "--served-model-name", "bench",
                        "--engine", "torch", "--device", "cpu", "--port", str(self.port), "--log-level", "warning"]
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
                    "DO_NOT_TRACK": "1"}
        self._place_log(log_dir, f"bench-infinity-{self.port}")
        self.url = f"http://127.0.0.1:{self.port}"

    def ready(self):
        import requests
        try:
            return requests.get(f"{self.url}/health", timeout=2).ok
        except requests.RequestException:
            return False

    def client(self):
        return _InfinityClient(f"{self.url}/embeddings")


class _InfinityClient:
    def __init__(self, url):
        import requests
        self.url, self.session = url, requests.Session()

    def encode(self, texts):
        reply = self.session.post(self.url, json={"model": "bench", "input": texts}, timeout=900)
        reply.raise_for_status()
        if len(reply.json()["data"]) != len(texts):
            raise RuntimeError("infinity returned the wrong number of embeddings")

    def close(self):
        self.session.close()


class InProcess:
    """An engine called directly in this process, with no service around it."""

    def __init__(self, name, encode):
        self.name, self._encode = name, encode
        self.peak_rss_mb = None

    def __enter__(self):
        return self

    def __exit__(self, *_):
        pass

    def client(self):
        return self

    def encode(self, texts):
        self._encode(texts)

    def close(self):
        pass


def sentence_transformers(model, threads, device="cpu", batch_size=32, fp16=False):
    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(threads)
    encoder = SentenceTransformer(str(model), device=device)
    if fp16:
        encoder.half()
    name = "sentence-transformers" if device == "cpu" else f"sentence-transformers ({device}{', fp16' if fp16 else ''})"
    return InProcess(name, lambda texts: encoder.encode(texts, batch_size=batch_size))


def our_backend(settings):
    """Our Embedder in-process: the service minus the service."""
    from encoder_server import Embedder
    from encoder_server.model.prepare import prepare_model

    return InProcess(f"{settings.backend} backend in-process", Embedder(prepare_model(settings)).embed_texts)
