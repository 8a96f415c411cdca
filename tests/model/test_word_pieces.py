"""encoder_server.model.word_pieces: BERT's WordPiece in Python gives normalized plain texts the ids,
special tokens, tokens and truncation that tokenizers gives them, and steps aside wherever it could
differ (another model or pre-tokenizer, padding, truncation from the left or of the second text)."""
import numpy as np
import pytest
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import models, pre_tokenizers, processors

from benchmark import corpus
from conftest import random_texts
from encoder_server.model.model_folder import default_model_path
from encoder_server.model.plain_text import PlainTexts
from encoder_server.model.word_pieces import WORDS_KEPT, Vocabulary, WordPieces, special_frame
from test_plain_text import cased_tokenizer, printable_ascii

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "aff", "able", "run", "##ning", "##s", "a", "b",
         "!", ".", "-", "'", "12", "##3", "x" * 9, "abcdefgh"]


def bare(vocab=VOCAB, max_chars=100, truncate=None):
    """A tokenizer as PlainTexts runs plain texts: WordPiece behind BertPreTokenizer, no normalizer."""
    tokenizer = FastTokenizer(models.WordPiece({piece: i for i, piece in enumerate(vocab)}, unk_token="[UNK]",
                                               max_input_chars_per_word=max_chars))
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    if truncate:
        tokenizer.enable_truncation(truncate)
    return tokenizer


def word_pieces(tokenizer):
    return WordPieces.of(tokenizer, Vocabulary.of(tokenizer))


def assert_same(tokenizer, texts):
    words = word_pieces(tokenizer)
    assert words is not None
    for special in (True, False):
        expected, got = tokenizer.encode_batch(texts, add_special_tokens=special), words.encode(texts, special)
        for text, want, have in zip(texts, expected, got):
            assert (have.ids, have.special_tokens_mask, have.tokens) == \
                   (want.ids, want.special_tokens_mask, want.tokens), repr(text)


def test_pieces_outside_the_vocabulary_are_cut_greedily_or_unknown():
    texts = ["unaffable", "affable", "unable", "running runs", "runx", "un-able!", "don't", "123 1233 12a", "ab",
             "xxxxxxxxx", "xxxxxxxxxx", "abcdefgh", "abcdefghi", "", "   ", "a.b.c", "zzz top",
             "##able un##able ##", "run, run. run runs; runs"]  # a word that is an entry with its marks is cut
    assert_same(bare(), texts)
    assert_same(bare(max_chars=8), texts)  # longer pieces are [UNK], even one the vocabulary holds ("x" * 9)
    assert word_pieces(bare(max_chars=8)).encode(["xxxxxxxxx unaffable"], False)[0].ids == [1, 1]


@pytest.mark.parametrize("truncate", [None, 5, 32])
def test_real_vocabularies_give_what_tokenizers_gives(truncate, tiny_model, tmp_path):
    texts = printable_ascii(1500, seed=3) + random_texts(300, seed=4) + corpus.texts("short", 300) \
        + corpus.texts("medium", 100) + ["word " * 300, "".join(map(chr, range(32, 127))), "[unused0] ##ing x##"]
    for folder in (default_model_path(), tiny_model, cased_tokenizer(tmp_path)):
        whole = FastTokenizer.from_file(str(folder / "tokenizer.json"))
        whole.no_padding()
        if truncate:
            whole.enable_truncation(truncate)
        else:
            whole.no_truncation()
        plain = PlainTexts(whole, Vocabulary.of(whole))
        assert plain.words is not None, folder
        assert_same(plain.bare, [plain.normalized(text) for text in texts if plain.normalized(text) is not None])


def test_it_steps_aside_where_it_could_differ(tiny_model):
    whole = FastTokenizer.from_file(str(tiny_model / "tokenizer.json"))
    whole.no_padding()
    assert PlainTexts(whole, Vocabulary.of(whole)).words is not None
    for change in (lambda t: t.enable_padding(length=40), lambda t: t.enable_truncation(16, direction="left"),
                   lambda t: t.enable_truncation(16, strategy="only_second"),
                   lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.WhitespaceSplit()),
                   lambda t: setattr(t, "model", models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))):
        other = FastTokenizer.from_str(whole.to_str())
        change(other)
        assert PlainTexts(other, Vocabulary.of(other)).words is None


def test_a_post_processor_it_does_not_frame_like_tokenizers_is_found_by_the_probe():
    tokenizer = bare()
    head, tail = special_frame(tokenizer)
    assert WordPieces(Vocabulary.of(tokenizer), head, tail, None).agrees_with(tokenizer)
    assert not WordPieces(Vocabulary.of(tokenizer), head, tail + tail, None).agrees_with(tokenizer)


def test_the_words_it_cuts_are_kept_within_bounds():
    vocabulary = Vocabulary.of(bare())
    words = [f"un{n}x" for n in range(WORDS_KEPT + 100)]
    for word in words:
        assert vocabulary.ids(f"a {word}") == [12, 1]  # "a", then [UNK]: no continuation of "un" fits
    assert len(vocabulary.cut_words) == WORDS_KEPT
    assert words[-1] in vocabulary.cut_words and words[0] not in vocabulary.cut_words  # the oldest went first
    long_word = "a." * 60  # longer than a piece may be (100 characters), its pieces not: cut each time, not kept
    assert vocabulary.ids(long_word) == [12, 15] * 60 and long_word not in vocabulary.cut_words


@pytest.mark.parametrize("seed", range(4))
def test_random_vocabularies_and_texts(seed):
    """Small random vocabularies, so that most words are cut into pieces or come out [UNK], over
    random texts of their letters, digits, punctuation and spaces, some words longer than the limit."""
    rng = np.random.default_rng(seed)
    alphabet = list("abcde0123-.!' ")
    pieces = {"".join(rng.choice(alphabet[:-1], size=rng.integers(1, 5))) for _ in range(60)}
    continued = sorted(f"##{piece}" for piece in pieces if rng.random() < 0.6)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *sorted(pieces), *continued]
    texts = ["".join(rng.choice(alphabet, size=rng.integers(0, 60))) for _ in range(400)]
    for truncate in (None, 7):
        assert_same(bare(vocab, max_chars=int(rng.integers(3, 12)), truncate=truncate), texts)
