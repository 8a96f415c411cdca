"""The `encoder-server` commands as a user runs them: start-up errors in one clear line, status,
keygen."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import zmq

from conftest import free_port

pytestmark = pytest.mark.timeout(300)


def _start(*flags):
    return subprocess.run([sys.executable, "-m", "encoder_server.cli", "start", *flags],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})


@pytest.mark.parametrize("flags, message", [
    (["--model", "/nonexistent/model"], "no such folder"),
    (["--model", "/tmp"], "no config.json"),
    (["--model", "no-such-org/no-such-model"], "not in the Hugging Face cache"),
    (["--max-seq-len", "100000"], "above the model's limit"),
    (["--pooling-layer", "9"], "--pooling-layer 9"),
    (["--pooling-strategy", "cls", "--mask-cls-sep"], "--mask-cls-sep"),
    (["--fp16"], "--fp16 needs --device cuda"),
    (["--cuda-graphs"], "--cuda-graphs needs --device cuda and --backend torch"),
    (["--authorized-clients", "/tmp"], "--authorized-clients needs --server-key"),
    (["--server-key", "/nonexistent/server.key_secret"], "--server-key /nonexistent/server.key_secret"),
    (["--max-pending-texts", "0"], "--max-pending-texts must be at least 1"),
    (["--host", "0.0.0.0", "--worker-port", "5999"], "--worker-port on 0.0.0.0 would let anyone who reaches it read"),
])
def test_start_up_errors_are_one_clear_line(tiny_model, flags, message):
    if "--model" not in flags:
        flags = ["--model", str(tiny_model), *flags]
    finished = _start(*flags, "--port", str(free_port()), "--port-out", str(free_port()))
    assert finished.returncode == 2
    assert message in finished.stderr and "Traceback" not in finished.stderr
    assert len(finished.stderr.strip().splitlines()) == 1


def _cuda_is_visible(backend):
    if backend == "onnx":
        import onnxruntime
        return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    import torch
    return torch.cuda.is_available()


@pytest.mark.parametrize("backend, message", [
    ("torch", "--device cuda: no CUDA device is visible to torch"),
    ("onnx", "--device cuda --backend onnx needs the onnxruntime-gpu package"),
])
def test_cuda_where_it_is_missing_is_one_clear_line(tiny_model, backend, message):
    """What a host without a GPU, or without onnxruntime-gpu, says to --device cuda (tests/cuda
    serves on one that has them)."""
    if _cuda_is_visible(backend):
        pytest.skip(f"this host has CUDA for {backend}: tests/cuda covers it")
    finished = _start("--model", str(tiny_model), "--device", "cuda", "--backend", backend,
                      "--port", str(free_port()), "--port-out", str(free_port()))
    assert finished.returncode == 2
    assert message in finished.stderr and "Traceback" not in finished.stderr
    assert len(finished.stderr.strip().splitlines()) == 1


def test_a_model_without_tokenizer_files_is_refused_before_any_worker_starts(tiny_model, tmp_path):
    """Once its workers failed to start three times each (30 s, exit code 1); now one line at once."""
    model = shutil.copytree(tiny_model, tmp_path / "model", ignore=shutil.ignore_patterns("tokenizer*", "vocab*"))
    finished = _start("--model", str(model), "--port", str(free_port()), "--port-out", str(free_port()))
    assert finished.returncode == 2 and "Traceback" not in finished.stderr, finished.stderr[-3000:]
    assert finished.stderr.splitlines() == [f"encoder-server: error: --model {model}: no tokenizer files; it needs "
                                            "tokenizer.json or a vocabulary such as vocab.txt, else its tokenizer "
                                            "would know no words"]


def test_a_tmpdir_too_long_for_the_ipc_sockets_is_a_clear_error(tiny_model, tmp_path):
    """Unix socket paths end at 107 bytes: a server whose TMPDIR is longer says so and exits,
    instead of children that crash on bind and are restarted until the server gives up."""
    long_dir = tmp_path / ("d" * 100)
    long_dir.mkdir()
    finished = subprocess.run([sys.executable, "-m", "encoder_server.cli", "start", "--model", str(tiny_model),
                               "--num-worker", "1", "--port", str(free_port()), "--port-out", str(free_port())],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(long_dir)})
    assert finished.returncode == 2, finished.stderr
    assert "too long a path for the server's ipc sockets" in finished.stderr and "set a shorter TMPDIR" in \
        finished.stderr and "Traceback" not in finished.stderr, finished.stderr
    assert [path for path in long_dir.iterdir() if path.name != ".ses"] == []  # its run folder is removed


def test_port_in_use_is_a_clear_error(tiny_model):
    with zmq.Context.instance().socket(zmq.PULL) as taken:
        port = taken.bind_to_random_port("tcp://127.0.0.1")
        finished = _start("--model", str(tiny_model), "--port", str(port), "--port-out", str(free_port()))
    assert finished.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in finished.stderr and "Traceback" not in finished.stderr


def test_bad_flag_is_rejected_without_traceback():
    finished = _start("--num-worker", "many")
    assert finished.returncode == 2 and "invalid int value" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_status_command_reports_ready(tiny_server):
    finished = subprocess.run([sys.executable, "-m", "encoder_server.cli", "status", "--port", str(tiny_server.port),
                               "--port-out", str(tiny_server.port_out)], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout)["workers_alive"] == 2


def test_status_command_fails_when_no_server():
    finished = subprocess.run([sys.executable, "-m", "encoder_server.cli", "status", "--port", str(free_port()),
                               "--port-out", str(free_port()), "--timeout", "1"],
                              capture_output=True, text=True, timeout=60)
    assert finished.returncode == 1 and "no answer" in finished.stderr


def test_keygen_keeps_an_existing_pair(tmp_path):
    """docker/compose.yaml runs keygen at every start: the keys its peers hold must survive it."""
    def keygen():
        return subprocess.run([sys.executable, "-m", "encoder_server.cli", "keygen", str(tmp_path)],
                               capture_output=True, text=True, timeout=60)

    first = keygen()
    secret = (tmp_path / "server.key_secret").read_bytes()
    second = keygen()
    assert first.returncode == second.returncode == 0 and "kept" in second.stdout and "kept" not in first.stdout
    assert (tmp_path / "server.key_secret").read_bytes() == secret
    (tmp_path / "server.key_secret").write_text("damaged")
    damaged = keygen()
    assert damaged.returncode == 2 and "error" in damaged.stderr and "Traceback" not in damaged.stderr


def test_waiting_for_a_server_that_never_answers_says_what_it_saw(tmp_path):
    """check and the quickstart wait for the server they start; one that never gets ready is named
    with what the last look at it saw, not only "not in time"."""
    from encoder_server.quickstart import wait_until_ready
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(SystemExit, match=r"did not become ready within 3 s \(the last check: no answer\)"):
            wait_until_ready(silent, timeout=3, port=free_port(), port_out=free_port())
    finally:
        silent.kill()
        silent.wait()
