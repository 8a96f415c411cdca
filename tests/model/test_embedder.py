"""The public in-process Embedder (`encoder_server.model.load()`, also `encoder_server.load_model`):
the model without the service, as Ray and other libraries call it. On the tiny random BERT,
against a plain reference."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import random_texts, reference_embeddings
from encoder_server import Embedder, load_model
from encoder_server.model import load

TEXTS = random_texts(40, seed=12, max_words=50) + ["cat"]


@pytest.fixture(scope="module")
def embedder(tiny_model):
    return load(str(tiny_model))


def test_embed_texts_matches_a_plain_reference_in_input_order(embedder, tiny_model):
    rows = embedder.embed_texts(TEXTS)
    assert rows.dtype == np.float32 and rows.shape == (len(TEXTS), embedder.dimension) == (41, 32)
    np.testing.assert_allclose(rows, reference_embeddings(tiny_model, TEXTS), atol=2e-5, rtol=1e-4)


def test_embed_tokens_takes_texts_already_split_into_words(embedder, tiny_model):
    words = [text.split() for text in TEXTS[:10]]
    expected = reference_embeddings(tiny_model, words, is_tokenized=True)
    np.testing.assert_allclose(embedder.embed_tokens(words), expected, atol=2e-5, rtol=1e-4)


def test_the_service_serves_what_the_embedder_computes(embedder, tiny_server):
    with tiny_server.client() as client:
        np.testing.assert_allclose(client.encode(TEXTS), embedder.embed_texts(TEXTS), atol=2e-5, rtol=1e-4)


def test_the_package_exports_the_same_loader_and_class(embedder):
    assert load_model is load and isinstance(embedder, Embedder)


def test_choices_are_the_servers_and_set_the_width(tiny_model):
    wide = load(str(tiny_model), pooling_strategy="mean_max", pooling_layer=[-1, -2], normalize=True)
    rows = wide.embed_texts(TEXTS[:5])
    assert wide.dimension == 32 * 2 * 2 and rows.shape == (5, wide.dimension)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("texts, error, message", [
    ([], ValueError, "empty list"),
    ("just a string", TypeError, "must be a list"),
    (["fine", ""], ValueError, r"texts\[1\] is empty"),
    (["fine", 7], TypeError, r"texts\[1\] must be a str"),
])
def test_bad_input_is_named(embedder, texts, error, message):
    with pytest.raises(error, match=message):
        embedder.embed_texts(texts)


def test_light_processes_never_load_the_model_libraries():
    """The CLI, settings (and the pooling names and widths they read), the gateway, the supervisor,
    the ventilator and the sink import neither torch nor transformers nor onnxruntime, nor even the
    tokenizers library (the ventilator loads it only for long texts embedded whole); Embedder loads
    its own libraries on first use, and those are not torch or transformers either."""
    code = ("import sys, encoder_server, encoder_server.cli, encoder_server.settings, encoder_server.gateway.serve, "
            "encoder_server.gateway.metrics_exporter, encoder_server.server.supervisor, "
            "encoder_server.server.ventilator, encoder_server.server.sink; "
            "heavy = [name for name in ('torch', 'transformers', 'onnxruntime', 'tokenizers') if name in sys.modules]; "
            "assert not heavy, heavy; encoder_server.Embedder; assert 'tokenizers' in sys.modules; "
            "assert not {'torch', 'transformers'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_supervisor_and_the_metrics_exporter_never_load_the_web_stack():
    """FastAPI and uvicorn are for the gateway's own process: the supervisor (which holds the
    gateway's entry point) and the exporter load neither."""
    code = ("import sys, encoder_server.cli, encoder_server.server.supervisor, encoder_server.gateway.children, "
            "encoder_server.gateway.metrics_exporter; "
            "assert not {'fastapi', 'uvicorn', 'starlette'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_servers_processes_never_import_asyncio():
    """asyncio (which pyzmq's monitor helpers and authenticator thread import) is for the async
    client and the gateway: it cost each of the server's processes about 0.2 of its imports' 0.65 CPU
    seconds (2-core AMD EPYC), paid again at every start and restart."""
    code = ("import sys, encoder_server.cli, encoder_server.server.supervisor, encoder_server.server.ventilator, "
            "encoder_server.server.sink, encoder_server.server.worker, encoder_server.gateway.metrics_exporter, "
            "encoder_client; encoder_client.EncoderClient; "
            "assert 'asyncio' not in sys.modules; encoder_client.AsyncEncoderClient; assert 'asyncio' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_an_onnx_worker_never_imports_torch_or_transformers(embedder, tmp_path):
    """What a worker process loads to serve: the worker module, then an Embedder on the prepared
    ONNX file, used for a pass. Neither torch nor transformers may be in sys.modules after it
    (each would cost a worker about 270 MB)."""
    import pickle

    settings_file = tmp_path / "settings.pickle"
    settings_file.write_bytes(pickle.dumps(embedder.spec))
    code = ("import pickle, sys; import encoder_server.server.worker as worker; "
            f"settings = pickle.loads(open({str(settings_file)!r}, 'rb').read()); "
            "embedder = worker.open_model(settings); embedder.embed_texts(worker.WARMUP_TEXTS); "
            "embedder.embed_tokens([['some', 'words']]); "
            "print(sorted(name for name in ('torch', 'transformers') if name in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True, text=True)
    assert loaded.stdout.strip() == "[]", loaded.stdout


def test_a_running_servers_supervisor_and_workers_map_no_torch_library(tiny_server):
    """The same, seen from outside in the real processes: none maps libtorch into memory."""
    from pathlib import Path

    pids = [tiny_server.process.pid, *tiny_server.worker_pids()]
    mapped = {pid: "libtorch" in Path(f"/proc/{pid}/maps").read_text() for pid in pids}
    assert not any(mapped.values()), mapped


def test_a_lone_pass_on_every_core_gives_the_same_rows(tiny_model):
    """The lone session (every core) computes what the lanes' session computes."""
    one_thread = load(str(tiny_model), threads_per_worker=1)
    embedder = Embedder(one_thread.spec, lone_threads=4)
    assert embedder.lone_backend is not None and one_thread.lone_backend is None
    encoding = embedder.tokenize(TEXTS)
    np.testing.assert_allclose(embedder.embed_encoding(encoding, alone=True),
                               embedder.embed_encoding(encoding), atol=1e-6)
