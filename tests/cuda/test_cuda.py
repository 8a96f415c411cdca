"""The CUDA paths, where a GPU is (marker `cuda`; skipped with a reason on machines without one):
fp32 and fp16 parity with a plain reference, with CUDA graphs (the default) and without, graphed
passes of every kind against eager ones and the cap on the outputs graphs keep, start and stop,
the default worker count and the memory estimate that caps it, kill -9 of a CUDA worker under
load, and ONNX Runtime's CUDA provider (served when onnxruntime-gpu is installed, a clear start-up
error otherwise). On the device machine: `pytest -m cuda tests/cuda`."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from conftest import FAULTS, random_texts, reference_embeddings, running_server, wait_for, workers_hold_jobs

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.cuda, pytest.mark.timeout(600),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device is visible to torch here")]
TEXTS = random_texts(200, seed=81, min_words=1, max_words=40) + ["Ünïcödé ✓ and the cat"]


def cosine_rows(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def expected(tiny_model):
    return reference_embeddings(tiny_model, TEXTS)


@pytest.mark.parametrize("fp16, graphs", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["fp32-eager", "fp16-eager", "fp32", "fp16"])
def test_cuda_rows_match_the_reference_and_the_server_stops_clean(tiny_model, tmp_path, expected, fp16, graphs):
    flags = ("--device", "cuda", "--max-batch-size", "32") + (("--fp16",) if fp16 else ()) + \
        (() if graphs else ("--no-cuda-graphs",))
    with running_server(tiny_model, *flags, tmp_path=tmp_path) as server:  # stops it, and checks no leftovers
        with server.client() as client:
            rows = client.encode(TEXTS)
            assert client.server_config["device"] == "cuda" and client.server_config["fp16"] == fp16
            assert client.server_config["cuda_graphs"] == graphs
    cosine = cosine_rows(rows, expected)
    assert cosine.min() >= (0.999 if fp16 else 0.99999), cosine.min()
    if not fp16:
        np.testing.assert_allclose(rows, expected, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_cuda_graphs_give_each_kind_of_pass_the_eager_rows(tiny_model, tiny_cross_encoder, tiny_sparse_encoder, fp16):
    """Passes of many shapes, one row to over the token budget (which runs eagerly), each through a
    graph captured for its padded shape: an embedder's (mean and token-level pooling), a reranker's
    (token type ids) and a sparse model's. In fp16 a graph's padded shape may run on other matrix
    kernels than the eager pass, whose rounding differs by an fp16 step of the logits: a sparse row's
    value differed by 0.0032 on an H200 (an fp16 step is 0.004 between 4 and 8); a padding row or
    column that leaked into the real ones would move values by far more."""
    from encoder_server.model.passes import plan_passes
    from encoder_server.model.spec import ModelSpec, resolve_spec
    from encoder_server.model.tokenizer import Tokenizer
    from encoder_server.model.torch_backend import TorchBackend
    for model, strategy in ((tiny_model, "mean"), (tiny_model, "none"), (tiny_sparse_encoder, None),
                            (tiny_cross_encoder, None)):
        spec = resolve_spec(ModelSpec(model=str(model), device="cuda", fp16=fp16, cuda_graphs=True,
                                      max_batch_tokens=768, pooling_strategy=strategy))
        backend, tokenizer = TorchBackend(spec), Tokenizer.for_spec(spec)
        encoding = tokenizer.tokenize_pairs("a query", TEXTS) if model == tiny_cross_encoder else \
            tokenizer.tokenize(TEXTS)
        for rows in (1, 3, 9, 32):
            for _, inputs in plan_passes(encoding, spec.max_batch_tokens, rows):
                graphed, eager = backend.run(inputs), backend.run_eagerly(inputs)
                assert graphed.shape == eager.shape
                np.testing.assert_allclose(graphed, eager, atol=1e-2 if fp16 else 1e-5, rtol=1e-2 if fp16 else 1e-4)
        assert len(backend.graphed.graphs) >= 4 and not backend.graphed.failed


def test_a_cuda_worker_waits_for_the_gpu_asleep():
    """A worker's wait for a pass's rows leaves its core to the tokenizing threads and the other
    processes: with the GPU busy for a while, the process spends a small part of it on the CPU (a
    spinning wait, as a plain .cpu() makes, spends all of it). The rows are those computed after
    the GPU's work, so the copy waited for it."""
    import torch

    from encoder_server.model.host_copy import to_host
    rows = torch.arange(6, dtype=torch.float16, device="cuda").reshape(2, 3)
    torch.cuda.synchronize()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(5):
        torch.cuda._sleep(100_000_000)  # GPU clock cycles: about 0.05 s on an H200
        host = to_host(rows * 2)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert host.dtype == np.float32 and host.tolist() == [[0, 2, 4], [6, 8, 10]]
    assert wall > 0.1 and cpu < 0.25 * wall, (cpu, wall)


def test_graphs_whose_outputs_would_pass_their_budget_leave_their_shapes_to_eager_passes(
        tiny_sparse_encoder, monkeypatch):
    """A sparse model's rows are vocabulary-wide: with room for a few outputs, the other shapes run
    eagerly, with the same rows."""
    from encoder_server.model import cuda_graphs
    from encoder_server.model.passes import plan_passes
    from encoder_server.model.spec import ModelSpec, resolve_spec
    from encoder_server.model.tokenizer import Tokenizer
    from encoder_server.model.torch_backend import TorchBackend
    spec = resolve_spec(ModelSpec(model=str(tiny_sparse_encoder), device="cuda"))
    assert spec.cuda_graphs
    monkeypatch.setattr(cuda_graphs, "OUTPUT_BYTES", 2 * 4 * spec.vocab_size * 4)  # two outputs of 4 rows
    backend = TorchBackend(spec)
    for _, inputs in plan_passes(Tokenizer.for_spec(spec).tokenize(TEXTS), spec.max_batch_tokens, 4):
        np.testing.assert_allclose(backend.run(inputs), backend.run_eagerly(inputs), atol=1e-5, rtol=1e-4)
    graphed = backend.graphed
    assert graphed.graphs and graphed.eager_shapes and graphed.output_bytes <= cuda_graphs.OUTPUT_BYTES


def test_a_torch_cuda_worker_keeps_attention_off_cudnn_whose_plans_are_per_shape(tiny_model):
    from encoder_server.model.spec import ModelSpec, resolve_spec
    from encoder_server.model.torch_backend import TorchBackend
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        TorchBackend(resolve_spec(ModelSpec(model=str(tiny_model), device="cuda", fp16=True)))
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)  # torch's default, for the tests after this one


def test_the_default_cuda_server_runs_a_worker_per_two_cpus(tiny_model, tmp_path):
    from encoder_server.model.cpus import default_cuda_workers, usable_cpus
    with running_server(tiny_model, "--device", "cuda", tmp_path=tmp_path) as server:
        with server.client() as client:  # a tiny model: the GPU's memory holds every worker the CPUs call for
            assert client.server_config["num_worker"] == default_cuda_workers(usable_cpus())
            assert client.encode(TEXTS[:8]).shape[0] == 8
        workers = server.worker_pids()
        assert len(workers) == default_cuda_workers(usable_cpus())
        # spawned, not forked: the launcher's look at the GPU started the CUDA driver in the supervisor
        assert all("--multiprocessing-fork" in psutil.Process(pid).cmdline() for pid in workers)


def test_each_cuda_worker_stays_within_its_memory_estimate_and_no_other_process_holds_the_gpu(tiny_model, tmp_path):
    """The default worker count trusts gpu_memory.worker_bytes to overstate what a worker holds, and
    the launcher to read the GPU's size without a CUDA context of its own."""
    from encoder_server.model.gpu_memory import worker_bytes
    from encoder_server.model.spec import ModelSpec, resolve_spec
    with running_server(tiny_model, "--device", "cuda", "--num-worker", "2", tmp_path=tmp_path) as server:
        with server.client() as client:  # and passes as large as the settings allow: 64 texts cut at max_seq_len
            client.encode(TEXTS * 4 + ["a text longer than any max_seq_len " * 200] * 128)
        used, workers = gpu_mib_by_pid(), server.worker_pids()
        if not set(workers) & set(used):
            pytest.skip("nvidia-smi shows no process of this server (it sees another pid namespace, or is missing)")
        launcher = psutil.Process(server.process.pid)
        others = {launcher.pid, *(child.pid for child in launcher.children(recursive=True))} - set(workers)
        assert not others & set(used), f"server processes other than the workers hold GPU memory: {used}"
        estimate = worker_bytes(resolve_spec(ModelSpec(model=str(tiny_model), device="cuda"))) >> 20
        assert all(used[pid] <= estimate for pid in workers), (used, estimate)


def gpu_mib_by_pid():
    """{pid: MiB of GPU memory} of the processes that nvidia-smi lists; {} when it lists none."""
    try:
        listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = (line.split(",") for line in listed.splitlines())
    return {int(row[0]): int(row[1]) for row in rows if len(row) == 2 and all(x.strip().isdigit() for x in row)}


def test_kill_9_of_a_cuda_worker_under_load_loses_nothing(tiny_model, tmp_path, expected):
    texts = TEXTS * 20
    # each holds the one tokenizing thread of the worker that takes it: the second goes to the other
    # worker, so the kill surely finds jobs in flight on both (as in tests/system/test_worker_failures.py)
    held = [1000, 3000]
    for index in held:
        texts[index] = "!sleep 2"
    with running_server(tiny_model, "--device", "cuda", "--num-worker", "2", "--tokenizer-threads", "1",
                        "--max-batch-size", "16", tmp_path=tmp_path, env=FAULTS) as server:
        with server.client() as client, server.client() as watcher:
            client.encode(texts, blocking=False)
            wait_for(lambda: workers_hold_jobs(watcher.server_status))
            os.kill(server.worker_pids()[0], signal.SIGKILL)
            rows = client.fetch_all(concat=True)
        kept = np.setdiff1d(np.arange(len(texts)), held)
        assert cosine_rows(rows[kept], np.tile(expected, (20, 1))[kept]).min() >= 0.99999
        wait_for(lambda: server.status()["ready"], timeout=120)
        status = server.status()
        assert status["worker_restarts"] == 1 and status["jobs_redispatched"] >= 1 and status["workers_alive"] == 2


def test_onnx_runtime_on_cuda_serves_or_says_what_is_missing(tiny_model, tmp_path, expected):
    import onnxruntime
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        with running_server(tiny_model, "--device", "cuda", "--backend", "onnx", tmp_path=tmp_path) as server:
            with server.client() as client:
                assert cosine_rows(client.encode(TEXTS), expected).min() >= 0.99999
        return
    started = subprocess.run([sys.executable, "-m", "encoder_server.cli", "start", "--model", str(tiny_model),
                              "--device", "cuda", "--backend", "onnx"], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert started.returncode != 0
    assert "--device cuda --backend onnx needs the onnxruntime-gpu package" in started.stderr + started.stdout
