"""BERT's WordPiece in Python, for the texts that PlainTexts has normalized: tokenizers' own ids, sooner.

On such a text (printable ASCII, lowercased for an uncased model, tabs and line breaks made
spaces), BertPreTokenizer splits at whitespace and around each ASCII punctuation character, and
WordPiece gives each piece its vocabulary id, or cuts it greedily into the longest known prefix and
`##` continuations, or makes it [UNK] when a part is unknown or the piece is longer than
max_input_chars_per_word. Most words between spaces are whole entries of the vocabulary: one dict
lookup; any other (a word with punctuation, or one outside the vocabulary) is cut at its punctuation
and into pieces once and kept, so that the next time it is one lookup too. tokenizers builds a full
encoding per text (token strings, offsets, word indices): Tokenizer.tokenize took 10 instead of 31
µs a short text on a 2-core AMD EPYC with each piece looked up in turn, and with words looked up
whole (and a long text's tokens counted in the same pass) it is 1.9x as fast again on short texts of
the benchmark's corpus, 1.8x on medium ones and 2.45x on long ones (`python -m benchmark.tokenizer
BEFORE`, six alternated rounds, 2026-12-01).

WordPieces.of(tokenizer, vocabulary) is None unless the tokenizer is exactly that (a WordPiece model behind a
BertPreTokenizer, no padding) and a probe of texts gets its own ids, special tokens and truncation.
"""
import re
from collections import OrderedDict

from tokenizers.models import WordPiece
from tokenizers.pre_tokenizers import BertPreTokenizer

PIECES = re.compile(r"[0-9A-Za-z]+|[!-/:-@\[-`{-~]")  # runs of letters and digits; each punctuation mark
WORDS_KEPT = 1 << 14  # words between spaces that are no whole entry, kept with their ids (a few MB at most)
PROBES = ["", "a", "The cat sat on the mat.", "unaffable xyzzy qwfpgj", "e=mc^2, 3.14 & $5 (50%) #1 @home",
          "".join(map(chr, range(32, 127))), "a" * 120, "don't stop-me now!", "tab\tand\nbreak", "word " * 600]


class Vocabulary:
    """A WordPiece model's tables: whole pieces, continuations (without their prefix), and ids' tokens."""

    def __init__(self, model, vocab):
        self.unk, self.max_chars = vocab[model.unk_token], model.max_input_chars_per_word
        # a piece longer than max_chars is [UNK] even where the vocabulary has it
        self.whole = {piece: i for piece, i in vocab.items() if len(piece) <= self.max_chars}
        prefix = model.continuing_subword_prefix
        self.continued = {piece[len(prefix):]: i for piece, i in vocab.items() if piece.startswith(prefix)}
        self.tokens = [None] * (max(vocab.values()) + 1)
        for piece, i in vocab.items():
            self.tokens[i] = piece
        # the entries that a word between spaces can be whole: BertPreTokenizer keeps no other in one piece
        self.whole_words = {piece: i for piece, i in self.whole.items() if PIECES.fullmatch(piece)}
        # other words recur too (a word and its comma, names, identifiers): each is cut once, while it stays
        self.cut_words = OrderedDict()

    @classmethod
    def of(cls, tokenizer):
        """The tables of a tokenizer's WordPiece model, or None for any other model or pre-tokenizer."""
        if not (isinstance(tokenizer.model, WordPiece) and isinstance(tokenizer.pre_tokenizer, BertPreTokenizer)):
            return None
        return cls(tokenizer.model, tokenizer.get_vocab(with_added_tokens=False))

    def ids(self, text):
        ids, whole, cut = [], self.whole_words, self.cut_words
        for word in text.split():
            i = whole.get(word)
            if i is None:
                ids += cut.get(word) or self._cut(word)
            else:
                ids.append(i)
        return ids

    def _cut(self, word):
        """The ids of a word between spaces that is no whole entry, kept for its next time when it is
        no longer than a piece may be (a tuple: callers share it). Longer ones are rare, and a
        client's could each be a long text: keeping them would bound the memory by their number
        alone."""
        ids = []
        for piece in PIECES.findall(word):
            i = self.whole.get(piece)
            if i is None:
                ids += self._split(piece)
            else:
                ids.append(i)
        ids = tuple(ids)
        if len(word) <= self.max_chars:
            if len(self.cut_words) >= WORDS_KEPT:
                self.cut_words.popitem(last=False)
            self.cut_words[word] = ids
        return ids

    def _split(self, piece):
        """A piece that is no whole entry: the longest known prefix, then continuations, or [UNK]."""
        if len(piece) > self.max_chars:
            return [self.unk]
        ids, start, table = [], 0, self.whole
        while start < len(piece):
            end = len(piece)
            while (found := table.get(piece[start:end])) is None:
                end -= 1
                if end == start:
                    return [self.unk]
            ids.append(found)
            start, table = end, self.continued
        return ids


class Pieces:
    """One text's encoding, as much of a tokenizers Encoding as the server reads, and how many
    tokens it had before truncation (`whole_length`, special tokens included), which tokenizers
    would have to encode the text again to tell."""
    __slots__ = ("ids", "framed", "vocabulary", "whole_length")

    def __init__(self, ids, framed, vocabulary, whole_length):
        self.ids, self.framed, self.vocabulary, self.whole_length = ids, framed, vocabulary, whole_length

    def __len__(self):
        return len(self.ids)

    @property
    def special_tokens_mask(self):
        head, tail = self.framed
        return [1] * head + [0] * (len(self.ids) - head - tail) + [1] * tail

    @property
    def tokens(self):
        return [self.vocabulary.tokens[i] for i in self.ids]


class WordPieces:
    """A configured tokenizer's encodings of normalized plain texts (see PlainTexts)."""

    def __init__(self, vocabulary, head, tail, max_length):
        self.vocabulary, self.head, self.tail, self.max_length = vocabulary, head, tail, max_length

    @classmethod
    def of(cls, tokenizer, vocabulary):
        """Those of `tokenizer` (its truncation kept), given its Vocabulary; None without one, and
        where they would differ from its own."""
        truncation = tokenizer.truncation
        if vocabulary is None or tokenizer.padding or (truncation and truncation["direction"] != "right"):
            return None
        words = cls(vocabulary, *special_frame(tokenizer), truncation["max_length"] if truncation else None)
        return words if words.agrees_with(tokenizer) else None

    def agrees_with(self, tokenizer):
        """Whether a probe of texts gets `tokenizer`'s own ids and special tokens, with and without them."""
        try:
            return all((want.ids, want.special_tokens_mask) == (have.ids, have.special_tokens_mask)
                       for special in (True, False)
                       for want, have in zip(tokenizer.encode_batch_fast(PROBES, add_special_tokens=special),
                                             self.encode(PROBES, special)))
        except Exception:  # a truncation the tokenizer refuses for single texts (only_second)
            return False

    def encode(self, texts, add_special_tokens=True):
        head, tail = (self.head, self.tail) if add_special_tokens else ([], [])
        framed, ids = (len(head), len(tail)), map(self.vocabulary.ids, texts)
        special = sum(framed)
        room = None if self.max_length is None else max(0, self.max_length - special)
        return [Pieces(head + row[:room] + tail, framed, self.vocabulary, special + len(row)) for row in ids]


def special_frame(tokenizer):
    """The special tokens that a tokenizer puts before and after a text's own."""
    empty, one = tokenizer.encode(""), tokenizer.encode("a").special_tokens_mask
    specials = [i for i, special in zip(empty.ids, empty.special_tokens_mask) if special]
    split = next((n for n, special in enumerate(one) if not special), len(specials))
    return specials[:split], specials[split:]
