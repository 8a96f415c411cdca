"""Long texts embedded whole (long_texts="chunk"): Tokenizer.windows and Embedder.embed_texts,
against sentence-transformers running each window by itself on the bundled all-MiniLM-L6-v2."""
import numpy as np
import pytest

from conftest import random_texts
from encoder_server.model import load
from encoder_server.model.tokenizer import Tokenizer, window_starts

OVERLAP = 32


@pytest.fixture(scope="module")
def bundled():
    return load(long_texts="chunk", chunk_overlap=OVERLAP)


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    from encoder_server.model.model_folder import default_model_path
    return SentenceTransformer(str(default_model_path()), device="cpu")


def st_window_mean(st_model, text, room, overlap):
    """The documented result, computed by sentence-transformers alone: the text's tokens (its own
    tokenizer) cut into windows, each run as [CLS] window [SEP] through Transformer and Pooling,
    their token-count-weighted mean, then normalized."""
    import torch

    tokenizer = st_model.tokenizer
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rows, weights = [], []
    for start in window_starts(len(ids), room, overlap):
        window = [tokenizer.cls_token_id, *ids[start:start + room], tokenizer.sep_token_id]
        features = {"input_ids": torch.tensor([window]), "attention_mask": torch.ones(1, len(window), dtype=torch.long),
                    "token_type_ids": torch.zeros(1, len(window), dtype=torch.long)}
        with torch.inference_mode():
            pooled = st_model[1](st_model[0](features))["sentence_embedding"][0].numpy()
        rows.append(pooled)
        weights.append(len(window))
    mean = np.average(rows, axis=0, weights=weights)
    return mean / np.linalg.norm(mean), len(rows)


def cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def text_of(tokens, seed=0):
    """A text of about `tokens` tokens (the tiny vocabulary's words are one token each here too)."""
    return " ".join(random_texts(tokens // 15 + 1, seed=seed, min_words=15, max_words=15))


def test_a_long_text_is_the_weighted_mean_of_its_windows_embedded_alone(bundled, st_model):
    text = text_of(1500)
    expected, windows = st_window_mean(st_model, text, 256 - 2, OVERLAP)
    rows = bundled.embed_texts(["a short one", text])
    assert windows >= 6
    assert cosine(rows[1], expected) >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1, rtol=1e-5)


def test_a_text_that_fits_gives_exactly_the_truncate_result(bundled, st_model):
    texts = ["a short one", text_of(200), "Ünïcödé ✓ 漢字 emoji 🎉"]
    np.testing.assert_array_equal(bundled.embed_texts(texts), bundled.embed_texts(texts, long_texts="truncate"))
    np.testing.assert_allclose(bundled.embed_texts(texts), st_model.encode(texts), atol=2e-5)


def test_error_refuses_a_text_too_long_and_truncate_keeps_its_start(bundled, st_model):
    with pytest.raises(ValueError, match=r"texts\[0\] has \d+ tokens, more than max_seq_len \(256\)"):
        bundled.embed_texts([text_of(400)], long_texts="error")
    np.testing.assert_allclose(bundled.embed_texts([text_of(400)], long_texts="truncate"),
                               st_model.encode([text_of(400)]), atol=2e-5)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return Tokenizer(tiny_model, 16)  # windows of 14 tokens and [CLS], [SEP]


def words(count):
    return " ".join((["cat", "dog", "sun", "red"] * count)[:count])  # one token each


@pytest.mark.parametrize("count, overlap, starts", [
    (14, 4, [0]),             # exactly max_seq_len with [CLS] and [SEP]: one window, as truncate gives
    (15, 4, [0, 10]),         # one token more: a second window, overlapping the first by 4
    (24, 4, [0, 10]),         # the second window reaches the end
    (25, 4, [0, 10, 20]),
    (28, 0, [0, 14]),         # no overlap
    (29, 13, list(range(16))),  # an overlap of room - 1 advances one token a window
])
def test_window_bounds(tokenizer, count, overlap, starts):
    assert window_starts(count, 14, overlap) == starts
    encoding, windows = tokenizer.windows([words(count)], overlap=overlap)
    assert windows == [len(starts)]
    tokens = [tokenizer._whole.token_to_id(f"{word}") for word in words(count).split()]
    cls, sep = tokenizer.frame
    assert encoding.ids == [cls + tokens[start:start + 14] + sep for start in starts]
    if len(starts) == 1:
        assert encoding.ids == tokenizer.tokenize([words(count)]).ids


def test_an_overlap_that_fills_the_window_is_refused(tokenizer):
    with pytest.raises(ValueError, match="overlap of 14 leaves no room"):
        tokenizer.windows([words(40)], overlap=14)
    with pytest.raises(ValueError, match="overlap of 10 leaves no room"):
        tokenizer.windows([words(40)], prompt="cat dog bird sun", overlap=10)  # 14 - 4 prompt tokens


def test_each_window_repeats_the_prompt_and_leaves_it_out_of_pooling_as_the_model_says(tiny_model):
    tokenizer = Tokenizer(tiny_model, 16, include_prompt=False)
    encoding, windows = tokenizer.windows([words(30)], prompt="dog bird ", overlap=2)
    dog, bird = tokenizer._whole.token_to_id("dog"), tokenizer._whole.token_to_id("bird")
    assert windows == [3] and all(ids[1:3] == [dog, bird] for ids in encoding.ids)
    assert all(pooled[:3] == [0, 0, 0] and pooled[3:] == [1] * (len(pooled) - 3) for pooled in encoding.pooled)
    fitted = tokenizer.windows(["cat"], prompt="dog bird ")[0]
    assert fitted.pooled == tokenizer.tokenize(["cat"], prompt="dog bird ").pooled


def test_a_huge_text_is_tokenized_in_segments_to_the_same_tokens(tokenizer):
    text = " ".join(random_texts(30_000, seed=5, max_words=12))  # about 1 MB: 16 segments
    whole = tokenizer._whole.encode(text, add_special_tokens=False).ids
    assert tokenizer._all_tokens(text) == whole


def test_only_texts_that_may_not_fit_need_tokenizing(tokenizer):
    assert tokenizer.surely_fit(["cat dog", "a" * 13])
    assert not tokenizer.surely_fit(["cat dog", "a" * 14])
    assert not tokenizer.surely_fit(["é" * 7])  # 14 bytes
