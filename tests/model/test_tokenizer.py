"""encoder_server.model.tokenizer: a huge text is cut to a prefix before the tokenizer sees it,
and the prefix keeps exactly the whole text's first tokens; truncation is counted; prompt tokens
stay out of pooling when the model says so. On the tiny random BERT's tokenizer.json, against
transformers' own tokenizer of the whole text."""
import shutil

import pytest
from transformers import AutoTokenizer

from conftest import random_texts
from encoder_server.model.tokenizer import MARGIN, MAX_CHARS_PER_TOKEN, Tokenizer, _cut_at_whitespace

LIMIT = 16  # tokens kept per text, [CLS] and [SEP] included


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return Tokenizer(tiny_model, LIMIT)


@pytest.fixture(scope="module")
def reference(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


def whole_text_ids(reference, text, is_tokenized=False):
    return reference(text, is_split_into_words=is_tokenized, truncation=True, max_length=LIMIT)["input_ids"]


@pytest.mark.parametrize("text", [
    " ".join(random_texts(40_000, seed=3, max_words=20)),            # about 1 MB of words
    "the cat sat on the mat. " * 50_000,                               # 1.2 MB, one sentence again and again
    "bird" * 20 + " " + "red " * 300_000,                              # a first word of many word pieces
], ids=["words", "repeated", "long-first-word"])
def test_a_huge_text_keeps_exactly_the_whole_texts_first_tokens(tokenizer, reference, text):
    prefix = tokenizer._bounded(text, is_tokenized=False)
    assert len(prefix) < len(text) // 100 and text.startswith(prefix)
    encoding = tokenizer.tokenize([text])
    assert encoding.ids[0] == whole_text_ids(reference, text)
    assert len(encoding.ids[0]) == LIMIT
    assert encoding.truncated[0] > LIMIT + MARGIN  # counted on the prefix: a lower bound


def test_text_without_whitespace_is_cut_regardless_at_the_longest_prefix(tokenizer, reference):
    junk = "a" * 10_000_000
    prefix = tokenizer._bounded(junk, is_tokenized=False)
    # prefixes grow 4-fold; the first at or past the longest one is kept, whatever its tokens
    assert LIMIT * MAX_CHARS_PER_TOKEN <= len(prefix) < 4 * LIMIT * MAX_CHARS_PER_TOKEN
    encoding = tokenizer.tokenize([junk])
    assert len(encoding.ids[0]) <= LIMIT and encoding.ids[0][0] == reference.cls_token_id
    assert encoding.ids[0][-1] == reference.sep_token_id


def test_a_huge_list_of_words_keeps_its_first_words(tokenizer, reference):
    words = ["cat", "dog", "sun"] * 400_000
    prefix = tokenizer._bounded(words, is_tokenized=True)
    assert len(prefix) < len(words) // 100 and prefix == words[:len(prefix)]
    assert tokenizer.tokenize([words], is_tokenized=True).ids[0] == whole_text_ids(reference, words, True)


def test_a_text_within_reach_is_tokenized_whole_and_its_truncation_counted_exactly(tokenizer, reference):
    short, long = "a cat", " ".join(["dog"] * 40)  # 40 words: within the first prefix, so counted exactly
    assert tokenizer._bounded(long, is_tokenized=False) == long
    encoding = tokenizer.tokenize([short, long])
    assert encoding.ids == [whole_text_ids(reference, short), whole_text_ids(reference, long)]
    assert encoding.truncated == {1: 42}  # 40 words, [CLS] and [SEP]


def test_truncation_is_counted_alike_for_ids_from_python_and_from_tokenizers(tiny_model, reference):
    plain, other = " ".join(["dog"] * 30) + " cat, sat", " ".join(["dög"] * 30)  # "ö": not plain, tokenizers'
    for python_pieces in (True, False):
        encoding = Tokenizer(tiny_model, LIMIT, python_pieces=python_pieces).tokenize(["a cat", plain, other])
        assert encoding.truncated == {i: len(reference(text)["input_ids"]) for i, text in ((1, plain), (2, other))}


@pytest.mark.parametrize("text, size, expected", [
    ("the cat sat", 9, "the cat"),        # never splits "sat"
    ("the cat sat", 7, "the cat"),        # a cut right at a space keeps the word before it
    ("the\ncat sat", 5, "the"),
    ("catsatonthemat", 5, "catsa"),       # one word: cut inside it
])
def test_a_cut_ends_at_whitespace(text, size, expected):
    assert _cut_at_whitespace(text, size) == expected


def test_prompt_tokens_stay_out_of_pooling_unless_the_model_includes_them(tiny_model):
    prompt = "query: "
    counted = Tokenizer(tiny_model, LIMIT).tokenize(["a cat"], prompt=prompt)
    left_out = Tokenizer(tiny_model, LIMIT, include_prompt=False).tokenize(["a cat"], prompt=prompt)
    assert counted.ids == left_out.ids
    prompt_tokens = len(left_out.ids[0]) - 4  # [CLS] "a" "cat" [SEP]: the rest is the prompt
    assert prompt_tokens > 0
    assert left_out.pooled_row(0) == [0] * (1 + prompt_tokens) + [1, 1, 1]  # [CLS] and the prompt left out
    assert counted.pooled_row(0) == [1] * len(counted.ids[0])


def test_mask_special_leaves_cls_and_sep_out_of_pooling(tiny_model):
    encoding = Tokenizer(tiny_model, LIMIT, mask_special=True).tokenize(["a cat sat"])
    assert encoding.pooled[0][0] == 0 and encoding.pooled[0][-1] == 0 and all(encoding.pooled[0][1:-1])


def test_a_folder_with_only_a_vocab_file_gets_the_tokenizer_transformers_builds_from_it(tiny_model, tmp_path):
    folder = shutil.copytree(tiny_model, tmp_path / "model", ignore=shutil.ignore_patterns("tokenizer.json"))
    text = "the cat sat on the mat, and the dog ran"
    converted = AutoTokenizer.from_pretrained(folder)
    assert Tokenizer(folder, LIMIT).tokenize([text]).ids[0] == whole_text_ids(converted, text)


def test_a_folder_without_tokenizer_files_is_refused_not_served_as_unknown_words(tiny_model, tmp_path):
    # transformers builds a BertTokenizer from config.json alone, knowing only [CLS], [SEP], [UNK], ...
    folder = shutil.copytree(tiny_model, tmp_path / "model", ignore=shutil.ignore_patterns("tokenizer*", "vocab.txt"))
    with pytest.raises(ValueError, match=f"{folder} has no tokenizer files \\(it needs tokenizer.json or vocab.txt\\)"):
        Tokenizer(folder, LIMIT)


def test_a_tokenizer_json_the_library_cannot_read_is_named_in_the_error(tiny_model, tmp_path):
    folder = shutil.copytree(tiny_model, tmp_path / "model")
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": 5}')
    with pytest.raises(ValueError, match=f"{folder / 'tokenizer.json'} is no tokenizer the tokenizers library can "
                                         "read: "):
        Tokenizer(folder, LIMIT)
