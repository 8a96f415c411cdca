"""Plain texts tokenized without the BERT normalizer, which on them only lowercases: the same ids, sooner.

A BERT tokenizer's normalizer (tokenizers' BertNormalizer) drops control characters, turns tabs and
line breaks into spaces, spaces out CJK characters, strips accents and, for an uncased model,
lowercases. On a text of printable ASCII, tabs and line breaks, all that amounts to replacing three
characters and `str.lower`, yet it costs nearly as much as the rest of tokenizing (it tracks each
character's alignment): about 20 of 50 µs for a short text on a 2-core AMD EPYC. So PlainTexts does
it in Python and encodes such texts with a second tokenizer made of the first one's model,
pre-tokenizer and post-processor, without its normalizer; every other text goes the usual way. So
does a text holding one of the tokenizer's added tokens ([CLS], [MASK]...) in any case, before or
after normalizing: those are matched in the text as it comes, or as normalized, so lowercasing
first could change what they match. Given a WordPiece model's Vocabulary (word_pieces.py), plain
texts (not pairs) skip the second tokenizer too: their ids come from Python, three times sooner.
"""
import re
from functools import partial

from tokenizers import Tokenizer
from tokenizers.normalizers import BertNormalizer

from .word_pieces import WordPieces

PLAIN = re.compile(r"[\t\n\r\x20-\x7e]*")  # printable ASCII, tabs and line breaks


def batch_encoder(tokenizer, vocabulary=None):
    """`encode(items, with_tokens=False, add_special_tokens=True, is_pretokenized=False)`: `tokenizer`'s
    encodings of a list of texts, of pairs of texts or of word lists, through PlainTexts where its
    normalizer is a BertNormalizer. `with_tokens`: encodings that carry token strings (the fast call
    tracks no offsets, and so gives none). `vocabulary`: the model's word_pieces.Vocabulary, for
    plain texts' ids from Python (their encodings are then word_pieces.Pieces, which have the ids,
    special_tokens_mask and tokens of a tokenizers Encoding, and nothing else); None: from the bare
    tokenizer."""
    if isinstance(tokenizer.normalizer, BertNormalizer):
        return PlainTexts(tokenizer, vocabulary).encode
    return partial(_encode_batch, tokenizer)


class PlainTexts:
    """A configured tokenizer (its truncation and padding are kept) with the fast path for plain texts;
    with a word_pieces.Vocabulary, plain texts' ids come from WordPieces where it serves."""

    def __init__(self, tokenizer, vocabulary=None):
        self.tokenizer = tokenizer
        normalizer = tokenizer.normalizer
        self.clean, self.lowercase = normalizer.clean_text, normalizer.lowercase
        # the same model, pre-tokenizer and post-processor objects (the vocabulary is shared, not
        # copied), without the normalizer and the added tokens, which no plain text holds
        self.bare = Tokenizer(tokenizer.model)
        self.bare.pre_tokenizer, self.bare.post_processor = tokenizer.pre_tokenizer, tokenizer.post_processor
        if tokenizer.truncation:
            self.bare.enable_truncation(**tokenizer.truncation)
        if tokenizer.padding:
            self.bare.enable_padding(**tokenizer.padding)
        self.words = WordPieces.of(self.bare, vocabulary)
        added = sorted({token.content.lower() for token in tokenizer.get_added_tokens_decoder().values()
                        if token.content})
        self.added = re.compile("|".join(map(re.escape, added))) if added else None

    def normalized(self, text):
        """`text` as the tokenizer's normalizer would make it, or None when it is not plain."""
        if not text.isascii():
            return None
        if text.isprintable():  # then without tabs and line breaks: the usual case, the quickest
            lowered = text.lower()
            if self.added is not None and self.added.search(lowered):
                return None
            return lowered if self.lowercase else text
        if not PLAIN.fullmatch(text):
            return None
        lowered = text.lower()
        spaced = _spaced(lowered) if self.clean else lowered
        if self.added is not None and any(self.added.search(form) for form in {lowered, spaced}):
            return None
        if self.lowercase:
            return spaced
        return _spaced(text) if self.clean else text

    def encode(self, items, with_tokens=False, add_special_tokens=True, is_pretokenized=False):
        """The tokenizer's encodings of `items` (texts, or pairs of texts), the plain ones through the
        bare tokenizer; word lists (`is_pretokenized`) all take the usual way."""
        if is_pretokenized:
            return _encode_batch(self.tokenizer, items, with_tokens, add_special_tokens, is_pretokenized)
        pairs = bool(items) and not isinstance(items[0], str)  # items are all texts, or all pairs (a reranker's)
        normalized = list(map(self._normalized_pair if pairs else self.normalized, items))
        if None not in normalized:
            return self._plain(normalized, with_tokens, add_special_tokens)
        plain = [index for index, item in enumerate(normalized) if item is not None]
        if not plain:
            return _encode_batch(self.tokenizer, items, with_tokens, add_special_tokens)
        others = [index for index, item in enumerate(normalized) if item is None]
        encoded = [None] * len(items)
        plain_ones = self._plain([normalized[i] for i in plain], with_tokens, add_special_tokens)
        other_ones = _encode_batch(self.tokenizer, [items[i] for i in others], with_tokens, add_special_tokens)
        for indices, encodings in ((plain, plain_ones), (others, other_ones)):
            for index, encoding in zip(indices, encodings):
                encoded[index] = encoding
        return encoded

    def _plain(self, normalized, with_tokens, add_special_tokens):
        """The encodings of normalized plain items: texts through WordPieces where it serves, else
        texts and pairs through the bare tokenizer."""
        if self.words is not None and normalized and isinstance(normalized[0], str):
            return self.words.encode(normalized, add_special_tokens)
        return _encode_batch(self.bare, normalized, with_tokens, add_special_tokens)

    def _normalized_pair(self, pair):
        pair = tuple(map(self.normalized, pair))
        return None if None in pair else pair


def _encode_batch(tokenizer, items, with_tokens=False, add_special_tokens=True, is_pretokenized=False):
    encode = tokenizer.encode_batch if with_tokens else tokenizer.encode_batch_fast
    return encode(items, add_special_tokens=add_special_tokens, is_pretokenized=is_pretokenized)


def _spaced(text):
    """`text` with its tabs and line breaks made spaces, as BertNormalizer's clean_text does
    (str.translate takes ten times as long)."""
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")
