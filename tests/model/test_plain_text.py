"""encoder_server.model.plain_text: plain texts tokenized without the BERT normalizer get exactly the
ids, tokens and truncation the whole tokenizer gives them, on the bundled model's tokenizer and on
cased and uncased BERT vocabularies (through word_pieces.py where the tokenizer is BERT's WordPiece;
tests/model/test_word_pieces.py has its own cases); texts it would change otherwise, and those naming
an added token, take the usual way."""
from functools import partial

import numpy as np
import pytest
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import normalizers, pre_tokenizers
from transformers import BertTokenizerFast

from benchmark import corpus
from conftest import random_texts
from encoder_server.model.model_folder import default_model_path
from encoder_server.model.plain_text import PlainTexts, _encode_batch, batch_encoder
from encoder_server.model.tokenizer import Tokenizer
from encoder_server.model.word_pieces import Vocabulary

ODD = [
    "", " ", "\t", "\n\n", "a\tb\nc\rd", "  leading and trailing  ", "UPPER lower MiXeD", "don't stop-me now!",
    "[MASK] is [mask], [Mask] or [MASK", "[CLS] [SEP] [PAD] [UNK]", "a[SEP]b", "[\tmask]", "x [mas\nk] y",
    "tab\t[MASK]\ttab", "price: $5.00 (50% off) #1 @home ~/path/a_b {x: [1, 2]} <tag> a|b ^ `q` \\ \"",
    "del\x7fchar", "bell\x07", "vertical\x0btab", "form\x0cfeed", "nul\x00byte", "café", "naïve CAFÉ", "東京 tokyo",
    "emoji 🙂 ok", "\u00a0non-breaking", "zero\u200bwidth", "combining e\u0301", "\ufffd replacement",
    "".join(map(chr, range(32, 127))), "".join(map(chr, range(0, 128))), "word " * 400,
]


def printable_ascii(count, seed):
    """Random strings of printable ASCII, tabs and line breaks, with bracketed words now and then."""
    rng = np.random.default_rng(seed)
    alphabet = [*map(chr, range(32, 127)), "\t", "\n", "\r", " ", " ", " ", "[MASK]", "[mask]", "[Sep]", "[PAD"]
    return ["".join(rng.choice(alphabet, size=rng.integers(0, 80))) for _ in range(count)]


TEXTS = (ODD + printable_ascii(3000, seed=1) + random_texts(500, seed=2) + corpus.texts("short", 500)
         + corpus.texts("medium", 200) + corpus.texts("long", 20))


def cased_tokenizer(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "The", "the", "Cat", "cat", "sat", "##s", "on", "mat", ".",
             *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ[]!?,", *(f"##{c}" for c in "abcdefghijklmnop")]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"), do_lower_case=False).save_pretrained(tmp_path)
    return tmp_path


@pytest.fixture(scope="module", params=["bundled", "tiny-uncased", "cased", "split-at-spaces"])
def tokenizer(request, tiny_model, tmp_path_factory):
    """A tokenizer as the server configures it (truncated at 32 tokens, no padding). The last splits
    words at spaces alone, so that a tab or a line break left as it is would change its tokens."""
    folder = {"bundled": default_model_path, "cased": lambda: cased_tokenizer(tmp_path_factory.mktemp("cased"))}.get(
        request.param, lambda: tiny_model)()
    tokenizer = FastTokenizer.from_file(str(folder / "tokenizer.json"))
    if request.param == "split-at-spaces":
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    tokenizer.no_padding()
    tokenizer.enable_truncation(32)
    return tokenizer


@pytest.mark.parametrize("python_pieces", [False, True])
def test_every_text_gets_what_the_whole_tokenizer_gives_it(tokenizer, python_pieces):
    plain = PlainTexts(tokenizer, Vocabulary.of(tokenizer) if python_pieces else None)
    assert (plain.words is not None) == (python_pieces and isinstance(tokenizer.pre_tokenizer,
                                                                        pre_tokenizers.BertPreTokenizer))
    for with_tokens in (False, True):
        method = "encode_batch" if with_tokens else "encode_batch_fast"
        expected, got = getattr(tokenizer, method)(TEXTS), plain.encode(TEXTS, with_tokens)
        for text, want, have in zip(TEXTS, expected, got):  # truncated at 32: `ids` shows the cut
            assert (have.ids, have.special_tokens_mask) == (want.ids, want.special_tokens_mask), repr(text)
            if with_tokens:
                assert have.tokens == want.tokens, repr(text)


def test_every_pair_gets_what_the_whole_tokenizer_gives_it(tokenizer):
    pairs = FastTokenizer.from_str(tokenizer.to_str())
    pairs.enable_truncation(32, strategy="only_second")  # a reranker's: the document is cut, not the query
    items = [(query, document) for query in ["Who Sat?", "[MASK] it", "café"] for document in TEXTS[::7]]
    plain = PlainTexts(pairs, Vocabulary.of(pairs))  # pairs take the bare tokenizer, whatever the vocabulary
    for want, have, item in zip(pairs.encode_batch_fast(items), plain.encode(items), items):
        assert (have.ids, have.type_ids, len(have.overflowing)) == (want.ids, want.type_ids, len(want.overflowing)), \
            repr(item)


def test_the_fast_path_takes_plain_texts_and_leaves_the_rest(tokenizer):
    plain = PlainTexts(tokenizer, Vocabulary.of(tokenizer))
    lowercase = tokenizer.normalizer.lowercase
    assert plain.normalized("The Cat\tsat\non\rthe mat.") == ("the cat sat on the mat." if lowercase
                                                               else "The Cat sat on the mat.")
    assert plain.normalized("") == ""
    for text in ["café", "東京", "del\x7f", "nul\x00", "vt\x0b", "\u00a0", "[MASK]", "a [mask] b", "[Cls]"]:
        assert plain.normalized(text) is None, repr(text)
    assert plain.normalized("x[SEP") is not None  # no added token: plain
    mixed = ["plain", "café", "PLAIN [MASK]", "Plain"]
    assert [row.ids for row in plain.encode(mixed)] == [row.ids for row in tokenizer.encode_batch_fast(mixed)]


def test_any_other_normalizer_is_left_to_the_tokenizer(tokenizer):
    """One that does more than lowercase plain texts: the fast path would change their tokens."""
    other = FastTokenizer.from_str(tokenizer.to_str())
    other.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace("s", "z")])
    assert [row.ids for row in batch_encoder(other)(TEXTS)] == [row.ids for row in other.encode_batch_fast(TEXTS)]


@pytest.mark.parametrize("python_pieces", [False, True])
def test_the_servers_tokenizer_gives_the_same_encoding_as_without_it(tiny_model, python_pieces):
    fast, usual = Tokenizer(tiny_model, 16, python_pieces=python_pieces), Tokenizer(tiny_model, 16)
    assert fast.python_pieces is python_pieces
    usual._encode = partial(_encode_batch, usual._tokenizer)
    for prompt in ("", "query: "):
        for with_tokens in (False, True):
            got, want = (tokenizer.tokenize(TEXTS, prompt=prompt, with_tokens=with_tokens)
                         for tokenizer in (fast, usual))
            assert (got.ids, got.pooled, got.tokens, got.truncated) == \
                   (want.ids, want.pooled, want.tokens, want.truncated)


def test_the_tokenizers_padding_is_kept(tiny_model):
    padded = FastTokenizer.from_file(str(tiny_model / "tokenizer.json"))
    padded.enable_padding(length=40, pad_id=0, pad_token="[PAD]")
    padded.enable_truncation(32)
    expected, got = padded.encode_batch_fast(TEXTS), PlainTexts(padded, Vocabulary.of(padded)).encode(TEXTS)
    assert [(row.ids, row.attention_mask) for row in got] == [(row.ids, row.attention_mask) for row in expected]
