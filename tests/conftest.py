"""Fixtures: a tiny random BERT in a temp folder, and real encoder-server processes on loopback."""
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from benchmark.non_reader import rss_mb, sink_pid  # noqa: F401 (the tests use them)
from encoder_client import EncoderClient
from encoder_server import ports
from encoder_server.ports import free_port  # noqa: F401 (the tests use it)

pytest_plugins = ["cpu_durations"]  # --cpu-durations=N

WORDS = ("the a an of to and in is was for on that with as by it at from this be are or not have has "
         "cat dog bird fish tree house car road city river sun moon star sky rain snow wind fire water "
         "red blue green big small old new fast slow good bad happy sad run walk jump read write sing").split()
START_TIMEOUT = 120
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):  # pytest -n: each runner its own ports
    ports.use_slice(int(os.environ["PYTEST_XDIST_WORKER"][2:]), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
FAULTS = {"ENCODER_SERVER_FAULTS": "1"}  # switches on the test-only hook of server.fault_injection
# heartbeats every 0.25 s, so a silent worker or ventilator counts as lost after 1.25 s, not 5 s
FAST_HEARTBEATS = {"ENCODER_SERVER_HEARTBEAT_INTERVAL": "0.25"}


def build_tiny_bert(folder, seed=0, max_positions=64):
    """A random 3-layer BERT with its tokenizer, saved in Hugging Face layout."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"abcdefghijklmnopqrstuvwxyz0123456789.,!?",
             *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz0123456789")]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab=str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=max_positions)
    BertModel(config).eval().save_pretrained(folder)
    return folder


def build_tiny_cross_encoder(folder, architecture="bert", seed=0, max_positions=64):
    """A random 2-layer cross-encoder (a one-label sequence-classification head) of `architecture`
    (bert, or distilbert: no token type ids), saved by sentence-transformers' CrossEncoder."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import (BertConfig, BertForSequenceClassification, DistilBertConfig,
                              DistilBertForSequenceClassification)

    folder = Path(folder)
    plain = build_tiny_bert(folder.parent / f"{folder.name}-plain")  # its vocabulary and tokenizer
    vocab_size = len((plain / "vocab.txt").read_text().split())
    if architecture == "bert":
        config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=37, max_position_embeddings=max_positions, num_labels=1,
                            initializer_range=0.2)
        model_class = BertForSequenceClassification
    else:
        config = DistilBertConfig(vocab_size=vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=37,
                                  max_position_embeddings=max_positions, num_labels=1, initializer_range=0.2)
        model_class = DistilBertForSequenceClassification
    torch.manual_seed(seed)
    for name in ("config.json", "model.safetensors"):
        (plain / name).unlink()
    model_class(config).eval().save_pretrained(plain)
    CrossEncoder(str(plain), device="cpu").save_pretrained(str(folder))
    shutil.rmtree(plain)
    return folder


def build_tiny_sparse_encoder(folder, pooling="max", seed=0, max_seq_length=48):
    """A random 2-layer SPLADE model saved by sentence-transformers' SparseEncoder (a BERT masked-
    language model, then SpladePooling with `pooling`), texts cut at `max_seq_length` tokens. Half
    the vocabulary has its MLM bias at -3, so its weights are almost always 0: rows have real zeros."""
    import torch
    from sentence_transformers import SparseEncoder
    from transformers import BertConfig, BertForMaskedLM

    folder = Path(folder)
    plain = build_tiny_bert(folder.parent / f"{folder.name}-plain")  # its vocabulary and tokenizer
    vocab_size = len((plain / "vocab.txt").read_text().split())
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=64, initializer_range=0.2)
    torch.manual_seed(seed)
    model = BertForMaskedLM(config).eval()
    with torch.no_grad():
        model.cls.predictions.bias.copy_(torch.where(torch.rand(vocab_size) < 0.5, -3.0, 0.0))
    for name in ("config.json", "model.safetensors"):
        (plain / name).unlink()
    model.save_pretrained(plain)
    encoder = SparseEncoder(str(plain), device="cpu")
    encoder[1].pooling_strategy = pooling
    encoder.max_seq_length = max_seq_length
    encoder.save_pretrained(str(folder))
    shutil.rmtree(plain)
    return folder


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory):
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("ce") / "tiny-ce")


@pytest.fixture(scope="session")
def tiny_sparse_encoder(tmp_path_factory):
    """A tiny random SPLADE model with max pooling (build_tiny_sparse_encoder)."""
    return build_tiny_sparse_encoder(tmp_path_factory.mktemp("sparse") / "tiny-sparse")


@pytest.fixture(scope="session", autouse=True)
def onnx_cache(tmp_path_factory):
    """A private ONNX cache for the session; servers inherit it through the environment. Under
    pytest -n the runners share it (its entries are keyed by content and built under a file lock),
    so a model that every runner serves is exported once: 10 CPU seconds an export here."""
    session_root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        session_root = session_root.parent  # the run's own folder, above each runner's
    path = session_root / "onnx-cache"
    path.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ENCODER_SERVER_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


class RunningServer:
    def __init__(self, process, port, port_out, log_path, tmpdir, client_keys=None):
        self.process, self.port, self.port_out = process, port, port_out
        self.log_path, self.tmpdir = log_path, tmpdir
        self.client_keys = client_keys or {}

    def client(self, **kwargs):
        kwargs.setdefault("timeout", 60)
        kwargs = {**self.client_keys, **kwargs}
        return EncoderClient("127.0.0.1", self.port, self.port_out, **kwargs)

    @property
    def log(self):
        return Path(self.log_path).read_text(errors="replace")

    def status(self):
        """The server's SHOW_STATUS report, asked for by a fresh client."""
        with self.client(timeout=10) as client:
            return client.server_status

    def worker_pids(self):
        with self.client(timeout=5) as client:
            return [int(name.rsplit(":", 1)[1]) for name in client.server_status["worker_busy_texts"]]

    def wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log}")
            try:
                with self.client(timeout=1) as client:
                    if client.server_status["ready"]:
                        return self
            except TimeoutError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"server not ready within {START_TIMEOUT}s:\n{self.log}")

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise


@contextmanager
def running_server(model_dir, *flags, tmp_path, ports=None, env=None, client_keys=None):
    """Start `encoder-server start` as a real process group; stop it and check nothing is left.
    `client_keys` are the server_key and client_key that its clients need under CURVE."""
    port, port_out = ports or (free_port(), free_port())
    tmp_path.mkdir(parents=True, exist_ok=True)
    tmpdir = short_tmpdir(tmp_path)
    log_path = tmp_path / f"server-{port}.log"
    model = ["--model", str(model_dir)] if model_dir is not None else []  # None: the flags name the models
    command = [sys.executable, "-m", "encoder_server.cli", "start", *model,
               "--port", str(port), "--port-out", str(port_out), *flags]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "TMPDIR": str(tmpdir), "HF_HUB_OFFLINE": "1", **(env or {})})
    server = RunningServer(process, port, port_out, log_path, tmpdir, client_keys)
    try:
        yield server.wait_ready()
    finally:
        server.stop()
        assert_no_leftovers(server)


_SHORT_DIRS = set()


def short_tmpdir(tmp_path):
    """A server's TMPDIR, one per `tmp_path`, whose path is short enough for the server's ipc sockets
    (Unix socket paths end at 107 bytes, and pytest's folders under pytest -n come close)."""
    path = Path(tempfile.gettempdir()) / f"es-test-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:12]}"
    path.mkdir(exist_ok=True)
    _SHORT_DIRS.add(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def short_dirs_removed():
    yield
    for path in _SHORT_DIRS:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def ray_temp_dir():
    """Ray's sessions (logs, sockets) in a folder of this runner's, removed at the end, rather than
    in /tmp/ray, where each run would leave four; short, for Ray's Unix sockets. Ray, and the bulk
    commands the tests start, take it from the environment. Ray Data's usage collection is off, as
    `encoder-server bulk` has it: its thread polls a Prometheus at localhost:9090, and once printed
    a logging error as this runner exited."""
    path = tempfile.mkdtemp(prefix="es-ray-")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", path)
        patch.setenv("RAY_DATA_USAGE_DISABLED", "1")
        yield path
        RAY_HEAD.stop()
    shutil.rmtree(path, ignore_errors=True)


def assert_no_leftovers(server):
    """No child process of the server's group and no ipc folder remain."""
    deadline = time.monotonic() + 10
    while group_alive(server.process.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(server.process.pid), "server processes outlived the stop"
    # onnxruntime itself keeps a small session-id file (.ses) in TMPDIR; everything else is ours
    assert [p for p in Path(server.tmpdir).iterdir() if p.name != ".ses"] == [], "ipc files left behind"


def wait_for(condition, timeout=60):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def workers_hold_jobs(status):
    """Whether one request is in flight and every worker holds some of its jobs (a moment to kill one)."""
    return status["in_flight_requests"] == 1 and all(status["worker_busy_texts"].values())


def settled_status(client, timeout=10):
    """The server's status once no request is in flight: a reply reaches its client a moment before
    the ventilator hears that its request is done and counts it."""
    wait_for(lambda: client.server_status["in_flight_requests"] == 0, timeout)
    return client.server_status


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.fixture(scope="session")
def tiny_server(tiny_model, tmp_path_factory):
    """Two workers, each tokenizing on three threads, small jobs so that requests split, tokens
    allowed. Shared by the whole run: a test that needs a server in a state of its own (killed,
    stalled, flooded) starts one."""
    with running_server(tiny_model, "--num-worker", "2", "--max-batch-size", "32", "--priority-batch-size", "4",
                        "--max-batch-tokens", "512", "--show-tokens-to-client", "--tokenizer-threads", "3",
                        tmp_path=tmp_path_factory.mktemp("tiny-server")) as server:
        yield server


@pytest.fixture(scope="session")
def one_worker_server(tiny_model, tmp_path_factory):
    """One worker: the target of hostile peers and subscribers, shared by the whole run. Every test
    leaves it serving (each checks that good clients still are)."""
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path_factory.mktemp("one-worker")) as server:
        yield server


@pytest.fixture(scope="session")
def small_queue_server(tiny_model, tmp_path_factory):
    """One worker and at most 2000 pending texts, so that floods fill it: shared like one_worker_server."""
    with running_server(tiny_model, "--num-worker", "1", "--max-pending-texts", "2000",
                        tmp_path=tmp_path_factory.mktemp("small-queue")) as server:
        yield server


@pytest.fixture(scope="session")
def several_models_server(tiny_model, tiny_cross_encoder, tmp_path_factory):
    """One server of two models from a models file: `embedder` (tiny_model, the default) and
    `reranker` (tiny_cross_encoder), with its HTTP gateway on `server.http_url`."""
    folder = tmp_path_factory.mktemp("several-models")
    (folder / "models.toml").write_text(f"""
[[models]]
names = ["embedder", "queries"]
model = "{tiny_model}"

[[models]]
name = "reranker"
model = "{tiny_cross_encoder}"
max_batch_size = 16
""")
    http_port = free_port()
    with running_server(None, "--models", str(folder / "models.toml"), "--num-worker", "1", "--http-port",
                        str(http_port), "--http-host", "127.0.0.1", tmp_path=folder) as server:
        server.http_url = f"http://127.0.0.1:{http_port}"
        wait_for(lambda: _http_ready(server.http_url), timeout=60)
        yield server


@pytest.fixture(scope="session")
def sparse_server(tiny_model, tiny_sparse_encoder, tmp_path_factory):
    """One server of the tiny SPLADE model (`sparse`, the default) and the tiny BERT (`embedder`), with
    its HTTP gateway on `server.http_url` and tokens allowed; jobs of 16 texts."""
    http_port = free_port()
    with running_server(tiny_sparse_encoder, "--model", tiny_model, "--num-worker", "1", "--max-batch-size", "16",
                        "--show-tokens-to-client", "--http-port", str(http_port),
                        tmp_path=tmp_path_factory.mktemp("sparse-server")) as server:
        server.http_url = f"http://127.0.0.1:{http_port}"
        wait_for(lambda: _http_ready(server.http_url), timeout=60)
        yield server


def _http_ready(url):
    import httpx
    try:
        return httpx.get(url + "/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def gateway(tiny_server, tmp_path_factory):
    """`encoder-server http` in front of tiny_server, without an API key, shared by the whole run."""
    from http_helpers import running_gateway

    with running_gateway(tiny_server.port, tiny_server.port_out, tmp_path_factory.mktemp("gateway")) as gateway:
        gateway.wait_status("/ready", 200)
        yield gateway


@pytest.fixture(scope="session")
def keyed_gateway(one_worker_server, tmp_path_factory):
    """`encoder-server http` in front of one_worker_server, with http_helpers.API_KEY."""
    from http_helpers import API_KEY, running_gateway

    with running_gateway(one_worker_server.port, one_worker_server.port_out, tmp_path_factory.mktemp("gateway"),
                         "--api-key", API_KEY) as gateway:
        gateway.wait_status("/ready", 200)
        yield gateway


class RayHead:
    """One Ray head for the tests that are not about starting Ray (`--ray-address` to it, or
    ray.init in the test's process): each would otherwise start and stop a Ray of its own. The
    bulk runs killed mid-way, and the two-node cluster, start their own. It starts at the first test
    that asks for it and stops once the runner's next test is outside USERS, where every such test
    lives (they run first: RUN_ORDER), rather than at the end of the session: an idle Ray, with Ray
    Data's actors, kept a tenth of a core busy for the rest of the suite."""
    USERS = Path(__file__).parent / "bulk"

    def __init__(self):
        self.cluster = None

    def address(self):
        if self.cluster is None:
            from ray.cluster_utils import Cluster
            self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
        return self.cluster.address

    def stop(self):
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None


RAY_HEAD = RayHead()


@pytest.fixture(scope="module")  # a module's at most: the head may stop between modules
def ray_head():
    return RAY_HEAD.address()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the test's own fixtures first: a module's ray.init connection to the head is closed by now
    if nextitem is None or RayHead.USERS not in Path(str(nextitem.path)).parents:
        RAY_HEAD.stop()


def pytest_sessionfinish(session):
    RAY_HEAD.stop()  # an interrupted run too


@functools.lru_cache(maxsize=4)
def _hugging_face_model(model_dir):
    """(tokenizer, model) of a folder, loaded once a runner: a load costs more than a test's texts."""
    from transformers import AutoModel, AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir), AutoModel.from_pretrained(model_dir).eval()


def reference_embeddings(model_dir, texts, layers=(-2,), strategy="mean", is_tokenized=False, max_length=None):
    """A plain in-process reference: Hugging Face model, numpy pooling (no server code involved)."""
    import torch

    tokenizer, model = _hugging_face_model(str(model_dir))
    rows = []
    for text in texts:
        encoded = tokenizer([text], is_split_into_words=is_tokenized, truncation=True,
                            max_length=max_length or model.config.max_position_embeddings, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**encoded, output_hidden_states=True).hidden_states
        parts = []
        for layer in layers:
            tokens = hidden[layer][0].numpy()
            parts.append({"mean": tokens.mean(0), "max": tokens.max(0), "cls": tokens[0],
                          "last": tokens[-1]}[strategy])
        rows.append(np.concatenate(parts))
    return np.stack(rows)


def raw_push(server, options=None):
    """A bare PUSH socket on the request port, as a client of any protocol (or an attacker) has."""
    import zmq
    push = zmq.Context.instance().socket(zmq.PUSH)
    for option, value in {zmq.LINGER: 0, **(options or {})}.items():
        push.setsockopt(option, value)
    push.connect(f"tcp://127.0.0.1:{server.port}")
    return push


def raw_sub(server, *topics, options=None):
    """A bare SUB socket on the result port, subscribed to `topics` as they are (an identity's
    whole topic is protocol.topic(identity)), once its subscriptions have reached the sink."""
    import zmq
    sub = zmq.Context.instance().socket(zmq.SUB)
    for option, value in {zmq.LINGER: 0, **(options or {})}.items():
        sub.setsockopt(option, value)
    for topic in topics:
        sub.setsockopt(zmq.SUBSCRIBE, topic)
    sub.connect(f"tcp://127.0.0.1:{server.port_out}")
    time.sleep(0.3)
    return sub


def raw_sockets(server, identity):
    """A PUSH to the request port and a SUB to `identity`'s whole topic on the result port, as a
    peer without our client has."""
    return raw_push(server), raw_sub(server, identity + b"\0")


def replies(sub, count, timeout_ms=10000):
    """Up to `count` replies from `sub`: (identity, the JSON body, every frame) each."""
    received = []
    while len(received) < count and sub.poll(timeout_ms):
        frames = sub.recv_multipart()
        received.append((frames[0], json.loads(frames[1]), frames))
    return received


def peak_rss_mb(pid):
    """The peak resident memory of process `pid` so far (VmHWM), in MB."""
    return rss_mb(pid, peak=True)


def random_texts(count, seed=0, min_words=1, max_words=30):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(min_words, max_words + 1))) for _ in range(count)]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: runs for minutes (the long soak); left out unless selected "
                                       "with -m slow")
    config.addinivalue_line("markers", "cuda: needs a CUDA device (tests/cuda); skipped with a reason without one")


# the folders whose tests run for many seconds first, the quick unit tests last: under pytest -n the
# runners then finish together, the last minutes filled with short tests. The container image's
# build, minutes on a fresh machine, goes before them all.
RUN_FIRST = ("test_image.py",)
RUN_ORDER = ("bulk", "system", "model", "gateway", "deploy", "server", "client")


def pytest_collection_modifyitems(config, items):
    """Long tests first (RUN_FIRST, RUN_ORDER); the slow ones left out of a run that selects no marker."""
    def rank(item):
        folder = Path(str(item.path)).parent.name
        if item.path.name in RUN_FIRST:
            return -1
        return RUN_ORDER.index(folder) if folder in RUN_ORDER else len(RUN_ORDER)

    items.sort(key=rank)  # stable: each folder keeps its own order
    if config.getoption("markexpr"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_terminal_summary(terminalreporter):
    """The figures tests record with record_property("report", ...), such as the container image's
    build time and size, at the end of the run."""
    figures = [value for outcome in ("passed", "failed") for report in terminalreporter.stats.get(outcome, [])
               if report.when == "call" for name, value in report.user_properties if name == "report"]
    if figures:
        terminalreporter.section("reported figures")
        for line in figures:
            terminalreporter.write_line(line)
