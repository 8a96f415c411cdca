"""A request's long_texts, dimensions and precision through a real server (tiny_server: two workers,
jobs of 32 rows, max_seq_len 64), against the model in-process and sentence-transformers'
quantize_embeddings with the ranges the server publishes."""
import numpy as np
import pytest
from sentence_transformers.util import quantize_embeddings

from conftest import random_texts
from encoder_client import ServerError
from encoder_server.model import load
from encoder_server.model.arrays import normalize_rows
from encoder_server.model.sample import SAMPLE

LONG = " ".join(random_texts(400, seed=7, min_words=10, max_words=10))  # about 4,000 tokens: 94 windows


@pytest.fixture(scope="module")
def chunking(tiny_model):
    return load(str(tiny_model), long_texts="chunk", chunk_overlap=32)


@pytest.fixture(scope="module")
def client(tiny_server):
    with tiny_server.client() as client:
        yield client


def test_long_texts_embedded_whole_over_the_wire_equal_the_model_in_process(client, chunking):
    texts = ["a cat", LONG, "dog " * 70, "the sun"]
    result = client.encode_result(texts, long_texts="chunk")
    assert result.windows[0] == result.windows[3] == 1 and result.windows[1] > 64 and result.windows[2] == 2
    np.testing.assert_allclose(result.embeddings, chunking.embed_texts(texts), atol=1e-5)
    normalized = client.encode(texts, long_texts="chunk", normalize=True)
    np.testing.assert_allclose(normalized, normalize_rows(chunking.embed_texts(texts)), atol=1e-5)


def test_texts_that_fit_give_the_truncate_result_and_say_one_window_each(client):
    texts = random_texts(20, seed=3)
    result = client.encode_result(texts, long_texts="chunk")
    assert result.windows == [1] * 20
    np.testing.assert_array_equal(result.embeddings, client.encode(texts))


def test_a_long_text_in_a_large_request_with_a_prompt(client, chunking):
    texts = random_texts(100, seed=4) + [LONG]
    rows = client.encode(texts, long_texts="chunk", prompt="cat dog ")
    np.testing.assert_allclose(rows, chunking.embed_texts(texts, prompt="cat dog "), atol=1e-5)


def test_long_texts_error_and_truncate(client):
    with pytest.raises(ServerError, match="has more than 64 tokens") as refused:
        client.encode(["a cat", LONG], long_texts="error")
    assert refused.value.code == "too_large"
    assert client.encode_result([LONG]).windows is None
    np.testing.assert_array_equal(client.encode([LONG], long_texts="truncate"), client.encode([LONG]))


@pytest.mark.parametrize("options, message", [
    ({"long_texts": "split"}, "long_texts must be one of truncate, error, chunk"),
    ({"long_texts": "chunk", "truncate": False}, "contradict"),
    ({"precision": "int4"}, "precision must be one of float32, float16, int8, uint8, binary, ubinary"),
    ({"dimensions": 0}, "dimensions must be from 1 to the model's 32"),
    ({"dimensions": 33}, "dimensions must be from 1 to the model's 32"),
])
def test_bad_output_options_are_named(client, options, message):
    with pytest.raises(ServerError, match=message):
        client.encode(["a cat"], **options)
    assert client.encode(["still serving"]).shape == (1, 32)


def test_chunk_takes_texts_not_word_lists(client):
    with pytest.raises(ServerError, match="long_texts=chunk takes texts"):
        client.encode([["a", "cat"]], is_tokenized=True, long_texts="chunk")


def test_options_of_the_wrong_type_are_refused_by_the_client(client):
    with pytest.raises(TypeError, match="dimensions must be a int"):
        client.encode(["a cat"], dimensions=True)
    with pytest.raises(TypeError, match="precision must be a str"):
        client.encode(["a cat"], precision=8)


def test_the_published_calibration_is_the_sample_embedded(client, tiny_model):
    calibration = client.server_config["calibration"]
    rows = load(str(tiny_model)).embed_texts(SAMPLE, normalize=False)
    starts, steps = (np.asarray(values, dtype=np.float32) for values in calibration["raw"])
    np.testing.assert_allclose(starts, rows.min(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(starts + steps * 255, rows.max(axis=0), rtol=1e-4, atol=1e-5)
    assert client.server_config["models"][0]["calibration"] == calibration


@pytest.mark.parametrize("precision", ["float16", "int8", "uint8", "binary", "ubinary"])
@pytest.mark.parametrize("normalize", [False, True])
def test_each_precision_is_quantize_embeddings_with_the_published_ranges(client, precision, normalize):
    texts = random_texts(300, seed=8)  # bulk jobs over both workers
    full = client.encode(texts, normalize=normalize)
    starts, steps = (np.asarray(values, dtype=np.float32)
                     for values in client.server_config["calibration"]["normalized" if normalize else "raw"])
    expected = full.astype(np.float16) if precision == "float16" else quantize_embeddings(
        full, precision, ranges=np.vstack([starts, starts + steps * 255]))
    served = client.encode(texts, precision=precision, normalize=normalize)
    assert served.dtype == expected.dtype and served.shape == expected.shape
    if precision in ("int8", "uint8"):  # a value on a step's edge may round either way through the ranges' float32
        assert np.abs(served.astype(int) - expected.astype(int)).max() <= 1
        assert np.mean(served == expected) > 0.999
    elif precision == "float16":  # two requests' float32 rows, cut into other passes, may differ in a last bit,
        # and a value that close to a half step then rounds either way
        np.testing.assert_array_max_ulp(served, expected, maxulp=1)
        assert np.mean(served == expected) > 0.999
    else:
        np.testing.assert_array_equal(served, expected)


def test_dimensions_cut_and_renormalize_and_combine_with_precision_and_windows(client, chunking):
    texts = ["a cat", LONG]
    full = chunking.embed_texts(texts)
    np.testing.assert_allclose(client.encode(texts, long_texts="chunk", dimensions=8, normalize=True),
                               normalize_rows(full[:, :8]), atol=1e-5)
    np.testing.assert_allclose(client.encode(texts, long_texts="chunk", dimensions=8), full[:, :8], atol=1e-5)
    assert client.encode(texts, long_texts="chunk", dimensions=16, precision="ubinary").shape == (2, 2)
    int8 = client.encode(texts, precision="int8", dimensions=5)
    np.testing.assert_array_equal(int8, client.encode(texts, precision="int8")[:, :5])


def test_the_bytes_on_the_wire_shrink_with_the_precision(client):
    texts = random_texts(64, seed=9)
    sizes = {precision: client.encode(texts, precision=precision).nbytes
             for precision in ("float32", "float16", "int8", "binary")}
    assert sizes == {"float32": 64 * 32 * 4, "float16": 64 * 32 * 2, "int8": 64 * 32, "binary": 64 * 4}
