"""A damaged ONNX cache entry is built again, and workers that can never start stop the server
with their first error in one line instead of being restarted forever (issue 17, item 8)."""
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import free_port, random_texts, running_server
from encoder_server.server import worker_pool
from encoder_server.model import model_cache

pytestmark = pytest.mark.timeout(600)
GIVE_UP_WITHIN = 60  # seconds for a server whose workers cannot start to exit


# ----- the cache: checksums written at build, checked at use -----

@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(model_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


class CountingBuild:
    def __init__(self, content=b"an onnx graph " * 100, extra=None):
        self.content, self.extra, self.calls = content, extra or {}, 0

    def __call__(self, target):
        self.calls += 1
        target.write_bytes(self.content)
        for name, data in self.extra.items():  # external-data files beside model.onnx
            (target.parent / name).write_bytes(data)


def test_a_build_lists_the_sha256_of_every_file_it_wrote(cache):
    build = CountingBuild(extra={"weights.data": b"w" * 5000})
    target = model_cache._cached("entry", build)
    sums = json.loads((target.parent / model_cache.CHECKSUMS).read_text())
    assert set(sums) == {"model.onnx", "weights.data"}
    assert model_cache._cached("entry", build) == target and build.calls == 1  # a sound entry is reused
    assert sorted(path.name for path in cache.iterdir()) == ["entry", "entry.lock"]  # no staging left


@pytest.mark.parametrize("damage", ["truncate", "flip", "external data"])
def test_a_damaged_entry_is_built_again_with_a_warning_naming_the_file(cache, caplog, damage):
    build = CountingBuild(extra={"weights.data": b"w" * 5000})
    target = model_cache._cached("entry", build)
    damaged = target.parent / ("weights.data" if damage == "external data" else "model.onnx")
    data = damaged.read_bytes()
    damaged.write_bytes(data[:1000] if damage == "truncate" else bytes([data[0] ^ 1]) + data[1:])
    with caplog.at_level(logging.WARNING, logger=model_cache.__name__):
        assert model_cache._cached("entry", build) == target
    assert build.calls == 2 and target.read_bytes() == build.content
    assert (target.parent / "weights.data").read_bytes() == b"w" * 5000
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert str(damaged) in warning and "sha256" in warning, warning


@pytest.mark.parametrize("checksums", [None, "{not json", '{"other.onnx": "00"}'])
def test_an_entry_without_a_readable_checksum_list_is_built_again(cache, caplog, checksums):
    build = CountingBuild()
    target = model_cache._cached("entry", build)
    listing = target.parent / model_cache.CHECKSUMS
    if checksums is None:
        listing.unlink()  # an entry built before checksums were kept
    else:
        listing.write_text(checksums)
    with caplog.at_level(logging.WARNING, logger=model_cache.__name__):
        model_cache._cached("entry", build)
    assert build.calls == 2
    assert json.loads(listing.read_text()).keys() == {"model.onnx"}
    assert any(str(listing) in record.getMessage() for record in caplog.records
               if record.levelno == logging.WARNING)


def test_a_build_killed_mid_way_leaves_nothing_behind_after_the_next_build(cache):
    stale = cache / ".build-entry-abc123"  # what a builder killed by SIGKILL leaves: its staging folder
    (stale / "scratch").mkdir(parents=True)
    (stale / "model.onnx").write_bytes(b"half")
    other = cache / ".build-other-abc123"  # another entry's build, perhaps running now: not ours to touch
    other.mkdir()
    model_cache._cached("entry", CountingBuild())
    assert sorted(path.name for path in cache.iterdir()) == [".build-other-abc123", "entry", "entry.lock"]


def test_a_failed_build_leaves_no_entry_and_the_next_one_builds(cache):
    def broken(target):
        target.write_bytes(b"half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError):
        model_cache._cached("entry", broken)
    assert sorted(path.name for path in cache.iterdir()) == ["entry.lock"]  # no entry, no staging
    build = CountingBuild()
    target = model_cache._cached("entry", build)
    assert target.read_bytes() == build.content
    assert json.loads((target.parent / model_cache.CHECKSUMS).read_text()).keys() == {"model.onnx"}


def test_a_sound_cached_file_is_served_without_a_child_process_and_nothing_else_is(cache, tiny_model):
    """prepare_model_apart takes a sound cached file in-process; an entry that is missing or
    damaged, or an int8 one (its check must run), is left to the child, and torch needs no file."""
    from dataclasses import replace

    from encoder_server.model.prepare import prepare_model_apart
    from encoder_server.model.spec import ModelSpec, resolve_spec

    spec = resolve_spec(ModelSpec(model=str(tiny_model), threads_per_worker=1))
    assert model_cache.served_file_if_cached(spec) is None  # nothing is built here
    _, built = model_cache.onnx_files(spec)
    assert model_cache.served_file_if_cached(spec) == built
    assert prepare_model_apart(spec).onnx_file == str(built)
    assert model_cache.served_file_if_cached(replace(spec, quantize="int8")) is None
    assert prepare_model_apart(replace(spec, backend="torch")).onnx_file is None
    built.write_bytes(built.read_bytes()[:1000])
    assert model_cache.served_file_if_cached(spec) is None  # the child builds it again


def test_an_install_that_cannot_export_serves_what_another_built_and_says_what_building_needs(
        cache, tiny_model, monkeypatch):
    """Without the exporters (the lean image has no torch), an entry that an install with other
    versions of them built for the same recipe serves; a missing one is a clear error, not an
    ImportError from a child process."""
    from encoder_server.model.model_folder import ConfigError
    from encoder_server.model.spec import ModelSpec, resolve_spec

    spec = resolve_spec(ModelSpec(model=str(tiny_model), threads_per_worker=1))
    _, built = model_cache.onnx_files(spec)
    monkeypatch.setattr(model_cache, "EXPORTERS", ("torch", "transformers", "onnx", "an_exporter_not_installed"))
    assert model_cache._key(spec, "fp32") != built.parent.name  # the exporters' versions differ
    assert model_cache.served_file_if_cached(spec) == built
    assert model_cache.onnx_files(spec) == (built, built)
    with pytest.raises(ConfigError, match="cannot build it: that needs torch, transformers, onnx"):
        model_cache.onnx_files(resolve_spec(ModelSpec(model=str(tiny_model), pooling_strategy="cls")))


# ----- the pool: counting start-up failures (fake processes, no model) -----

class FakePipe:
    """Both ends of a one-way pipe, in one process."""

    def __init__(self):
        self.said, self.writer_closed = [], False

    def send(self, value):
        self.said.append(value)

    def poll(self):
        return bool(self.said) or self.writer_closed

    def recv(self):
        if not self.said:
            raise EOFError
        return self.said.pop(0)

    def close(self):
        self.writer_closed = True  # the reader's close is never read again, so one flag serves both


class FakeProcess:
    pids = iter(range(1000, 100000))

    def __init__(self, target, args, name):
        self.name, self.pipe = name, next(arg for arg in args if isinstance(arg, FakePipe))
        self.pid, self.exitcode, self.sentinel = next(self.pids), None, None

    def start(self):
        pass

    def fails_to_start(self, error="OSError: no model here"):
        self.pipe.send(error)
        self.exit(1)

    def serves(self):
        self.pipe.send(None)

    def exit(self, code):
        self.pipe.writer_closed = True
        self.exitcode = code


class FakeContext:
    def Pipe(self, duplex):  # noqa: N802 (multiprocessing's name)
        pipe = FakePipe()
        return pipe, pipe

    Process = FakeProcess


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(worker_pool, "restart_pause", lambda quick_deaths: 0.0)  # restarts at once
    return worker_pool.WorkerPool(FakeContext(), [SimpleNamespace(num_worker=2)], endpoints=None)


def fail_all(pool, rounds, error="OSError: no model here"):
    for _ in range(rounds):
        for worker in list(pool.workers.values()):
            worker.fails_to_start(error)
        pool.restart_exited()


def test_the_pool_gives_up_once_every_worker_failed_to_start_n_times_in_a_row(pool):
    for _ in range(worker_pool.MAX_FAILED_STARTS):
        pool.workers[0].fails_to_start("OSError: the first error")
        pool.restart_exited()
    assert pool.cannot_start() is None  # worker-1 may yet start
    for _ in range(worker_pool.MAX_FAILED_STARTS - 1):
        pool.workers[1].fails_to_start()
        pool.restart_exited()
    assert pool.cannot_start() is None
    pool.workers[1].fails_to_start()
    pool.restart_exited()
    assert pool.cannot_start() == "worker-0: OSError: the first error"


def test_a_serving_worker_keeps_the_pool_going(pool):
    pool.workers[1].serves()
    for _ in range(worker_pool.MAX_FAILED_STARTS + 2):
        pool.workers[0].fails_to_start()
        pool.restart_exited()
    assert pool.failed_starts[0] == worker_pool.MAX_FAILED_STARTS + 2 and pool.cannot_start() is None


def test_a_crash_after_the_model_loaded_ends_the_run_of_failed_starts(pool):
    fail_all(pool, worker_pool.MAX_FAILED_STARTS - 1)
    for worker in list(pool.workers.values()):
        worker.serves()
        worker.exit(-9)
    pool.restart_exited()
    fail_all(pool, worker_pool.MAX_FAILED_STARTS - 1)
    assert dict(pool.failed_starts) == {0: worker_pool.MAX_FAILED_STARTS - 1, 1: worker_pool.MAX_FAILED_STARTS - 1}
    assert pool.cannot_start() is None


def test_a_worker_killed_before_it_said_anything_counts_as_a_failed_start(pool):
    for _ in range(worker_pool.MAX_FAILED_STARTS):
        for worker in list(pool.workers.values()):
            worker.exit(-9)
        pool.restart_exited()
    assert pool.cannot_start() == "worker-0: exited with code -9 before it was ready"


def test_the_worker_sends_its_start_up_error_in_one_line(monkeypatch):
    from encoder_server.server import worker as worker_module

    def broken(*args):
        raise ValueError("bad\nmodel   file")

    monkeypatch.setattr(worker_module, "Worker", broken)
    monkeypatch.setattr(worker_module, "start_child", lambda name, verbose, cpus: (logging.getLogger(name), None))
    pipe = FakePipe()
    with pytest.raises(ValueError):
        worker_module.run_worker(SimpleNamespace(verbose=False), None, 0, False, True, pipe)
    assert pipe.said == ["ValueError: bad model file"]


# ----- real servers -----

def test_a_truncated_cached_model_is_rebuilt_and_the_server_serves_the_same_embeddings(tiny_model, tmp_path):
    from encoder_server.model import load

    texts = random_texts(20, seed=17)
    embedder = load(str(tiny_model), threads_per_worker=1)
    expected = embedder.embed_texts(texts)
    shared = Path(embedder.spec.onnx_file)  # in the session's cache: built once
    cached = tmp_path / "cache" / shared.parent.name / shared.name
    shutil.copytree(shared.parent, cached.parent)
    with open(cached, "r+b") as handle:
        handle.truncate(1000)
    env = {model_cache.CACHE_ENV: str(tmp_path / "cache")}
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path, env=env) as server:
        with server.client() as client:
            again = client.encode(texts)
        log = server.log
    np.testing.assert_allclose(again, expected, rtol=0, atol=1e-6)
    assert f"{cached} does not match its sha256" in log
    assert os.path.getsize(cached) > 1000


def _run(command, model, tmp_path, *flags):
    """`encoder-server start` or `check` on `model`, to its end, with a cache of its own."""
    ports = ["--port", str(free_port()), "--port-out", str(free_port())] if command == "start" else []
    return subprocess.run([sys.executable, "-m", "encoder_server.cli", command, "--model", str(model), *ports, *flags],
                          capture_output=True, text=True, timeout=GIVE_UP_WITHIN,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "ENCODER_SERVER_CACHE": str(tmp_path / "cache")})


@pytest.mark.parametrize("command, backend, weights", [("start", "onnx", "model.safetensors"),
                                                       ("start", "torch", "model.safetensors"),
                                                       ("check", "onnx", "model.safetensors"),
                                                       ("start", "torch", "pytorch_model.bin")])
def test_weights_cut_short_are_refused_at_once_in_one_line_naming_the_file(tiny_model, tmp_path, command, backend,
                                                                           weights):
    """Once found by the ONNX export, or by each worker in turn with the torch backend (30 s)."""
    model = shutil.copytree(tiny_model, tmp_path / "model")
    if weights == "pytorch_model.bin":  # the tiny model's weights as torch.save writes them
        import torch
        from safetensors.torch import load_file
        torch.save(load_file(model / "model.safetensors"), model / weights)
        (model / "model.safetensors").unlink()
    with open(model / weights, "r+b") as handle:
        handle.truncate(handle.seek(0, 2) - 100)
    finished = _run(command, model, tmp_path, "--backend", backend)
    assert finished.returncode == 2 and "Traceback" not in finished.stderr, finished.stderr[-3000:]
    why = {"model.safetensors": "not readable as safetensors (Error while deserializing header: incomplete "
                                "metadata, file not fully covered)",
           "pytorch_model.bin": "cut short (a zip archive without its end record)"}[weights]
    assert finished.stderr.splitlines() == [
        f"encoder-server: error: --model {model}: {model / weights}: {why}; copy or download it again"]


def mismatched_weights(tiny_model, tmp_path):
    """A copy of the tiny model whose word embeddings are one column short: a checkpoint of another
    model, which safetensors reads and transformers refuses to load."""
    from safetensors.torch import load_file, save_file
    model = shutil.copytree(tiny_model, tmp_path / "model")
    weights = load_file(model / "model.safetensors")
    name = next(name for name in weights if "word_embeddings" in name)
    weights[name] = weights[name][:, :-1].contiguous()
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    return model


@pytest.mark.parametrize("command", ["start", "check"])
def test_weights_the_exporter_cannot_load_stop_the_onnx_export_with_one_line_naming_the_model(
        tiny_model, tmp_path, command):
    model = mismatched_weights(tiny_model, tmp_path)
    finished = _run(command, model, tmp_path)
    assert finished.returncode == 2 and "Traceback" not in finished.stderr, finished.stderr[-3000:]
    assert finished.stderr.splitlines()[-1].startswith(
        f"encoder-server: error: --model {model}: its ONNX file could not be built: RuntimeError: "), finished.stderr
    assert not list((tmp_path / "cache").glob("*/model.onnx")) and not list((tmp_path / "cache").glob(".build-*"))


def test_workers_that_can_never_start_stop_the_server_with_their_first_error(tiny_model, tmp_path):
    """Here each worker fails on a tokenizer.json that the tokenizers library cannot read (whole, and
    so passed by the supervisor, which reads only its end)."""
    model = shutil.copytree(tiny_model, tmp_path / "model")
    (model / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    log_path = tmp_path / "server.log"
    command = [sys.executable, "-m", "encoder_server.cli", "start", "--model", str(model),
               "--num-worker", "1", "--port", str(free_port()), "--port-out", str(free_port())]
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        code = process.wait(GIVE_UP_WITHIN)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        pytest.fail(f"still running after {GIVE_UP_WITHIN}s:\n{log_path.read_text()[-3000:]}")
    took = time.monotonic() - started
    lines = log_path.read_text(errors="replace").splitlines()
    (verdict,) = [line for line in lines if "workers cannot start" in line]
    assert code == 1 and took < GIVE_UP_WITHIN
    unreadable = f"{model / 'tokenizer.json'} is no tokenizer the tokenizers library can read"
    assert "worker-0: ValueError: " + unreadable in verdict, verdict
    failed = [line for line in lines if "could not start" in line]
    assert len(failed) >= worker_pool.MAX_FAILED_STARTS and all(unreadable in line for line in failed)
