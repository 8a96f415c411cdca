"""Tokenization with the model's fast tokenizer: prompts prepended, long texts truncated (and
counted), and which tokens count in pooling.

It runs the folder's `tokenizer.json` with the `tokenizers` library alone, so a worker never imports
transformers (nor, through it, torch); only a folder without a tokenizer.json has it converted by
transformers. The file's own truncation and padding (the bundled one pads everything to 128) are
replaced: we truncate at the server's limit and pad later, per pass.

A tokenizer's memory grows with its input (about 100 bytes per character), whatever the limit, so
a text far longer than `truncate_at` tokens is first cut to a prefix that still has more than
`truncate_at` tokens, ending at whitespace: its first `truncate_at` tokens, all that is kept, are
the same as the whole text's. The prefix starts at CHARS_PER_TOKEN characters per token allowed
and grows while it has too few tokens, up to MAX_CHARS_PER_TOKEN, where a text (whitespace or
junk that yields almost no tokens) is cut regardless.

A text embedded whole instead (`windows`) is cut into windows of its tokens, each framed as a text
of its own: [CLS], the prompt's tokens, at most `truncate_at` tokens in all, [SEP]. A text of more
than SEGMENT_CHARS characters is tokenized in segments cut at whitespace, for the same reason;
a tokenizer that splits words at whitespace first (WordPiece, byte-level BPE) gives the same
tokens either way.
"""
import json
from pathlib import Path

from tokenizers import Tokenizer as FastTokenizer

from .passes import Encoding
from .plain_text import batch_encoder
from .word_pieces import Pieces, Vocabulary, special_frame

CHARS_PER_TOKEN = 8          # the first prefix tried: enough for almost any real text
MAX_CHARS_PER_TOKEN = 1024   # the longest prefix: past it, a text is cut regardless
MARGIN = 8                   # tokens beyond the limit a prefix must have, so a cut word can't matter
SEGMENT_CHARS = 1 << 16      # a text embedded whole is tokenized this many characters at a time,
SEGMENTS_AT_ONCE = 16        # and this many segments per call (about 100 bytes of memory per character)


class Tokenizer:
    """`python_pieces`: plain texts of a WordPiece model get their ids from Python (word_pieces.py),
    three times as fast as through `tokenizers` but holding the GIL, which `tokenizers` releases;
    False where other threads of the process must go on meanwhile (the ventilator's windowing) or
    tokenize at once (a worker's several tokenizing threads)."""

    def __init__(self, model_dir, truncate_at, mask_special=False, include_prompt=True, python_pieces=True):
        self.model_dir = model_dir
        self._tokenizer = load_fast_tokenizer(model_dir)
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(truncate_at)
        # WordPiece's tables, shared by the encoders below
        self._vocabulary = Vocabulary.of(self._tokenizer) if python_pieces else None
        self._encode = batch_encoder(self._tokenizer, self._vocabulary)
        self._whole = load_fast_tokenizer(model_dir)  # no truncation: to count a text's tokens
        self._whole.no_padding()
        self._whole.no_truncation()
        self._encode_whole = batch_encoder(self._whole, self._vocabulary)
        self._pairs = None  # encodes (query, document) pairs, truncating the document alone; made on first use
        self.truncate_at = truncate_at
        self.mask_special = mask_special      # leave [CLS] and [SEP] out of pooling
        self.include_prompt = include_prompt  # whether a prompt's tokens count in pooling
        self.pad_id = pad_token_id(model_dir, self._tokenizer)
        self.special_ids = {i for i, token in self._tokenizer.get_added_tokens_decoder().items() if token.special}
        self._prompt_lengths = {}
        self.frame = special_frame(self._whole)  # ([CLS], [SEP]) for BERT

    @property
    def python_pieces(self):
        """Whether plain texts get their ids from Python (a WordPiece model, and python_pieces asked)."""
        return self._vocabulary is not None

    @classmethod
    def for_spec(cls, spec, python_pieces=True):
        """The tokenizer that a resolved spec describes (model folder, truncation, pooled tokens)."""
        return cls(spec.encoder_path, spec.truncate_at, spec.pooling.mask_cls_sep, spec.include_prompt, python_pieces)

    def tokenize(self, texts, is_tokenized=False, with_tokens=False, prompt=""):
        """Texts (or, with is_tokenized, lists of words) as an Encoding, each prefixed by `prompt`."""
        if prompt:
            texts = [prompt + text for text in texts]
        whole = self._whole_size(is_tokenized)  # (asked once: the usual text is shorter, and kept as it is)
        texts = [item if len(item) <= whole else self._bounded(item, is_tokenized) for item in texts]
        encoded = self._encode(texts, with_tokens, is_pretokenized=is_tokenized)
        ids = [row.ids for row in encoded]
        skip = 0 if self.include_prompt or not prompt else self._prompt_length(prompt)
        pooled = [[int(i >= skip and not (self.mask_special and s)) for i, s in enumerate(row.special_tokens_mask)]
                  for row in encoded] if skip or self.mask_special else None
        tokens = [row.tokens for row in encoded] if with_tokens else None
        return Encoding(ids, pooled, tokens, self._truncated(texts, encoded, is_tokenized))

    def windows(self, texts, prompt="", overlap=0):
        """(Encoding, windows per text) of texts embedded whole: a text that fits is tokenized as
        `tokenize` does; a longer one becomes windows of at most `truncate_at` tokens, its own
        tokens overlapping by `overlap` from one window to the next (see window_starts). ValueError
        when the prompt leaves no room, or `overlap` fills a window."""
        fitted = self.tokenize(texts, prompt=prompt)
        if not fitted.truncated:
            return fitted, [1] * len(texts)
        head, tail = self.frame
        prompt_ids = self._whole.encode(prompt, add_special_tokens=False).ids if prompt else []
        room = self.truncate_at - len(head) - len(tail) - len(prompt_ids)
        if room < 1 or overlap >= room:
            raise ValueError(f"a window holds {max(room, 0)} tokens of a text (max_seq_len {self.truncate_at}, less "
                             f"special and prompt tokens), so the overlap of {overlap} leaves no room: use less")
        ids, counts = [], []
        for index, text in enumerate(texts):
            if index not in fitted.truncated:
                ids.append(fitted.ids[index])
                counts.append(1)
                continue
            tokens = self._all_tokens(text)
            starts = window_starts(len(tokens), room, overlap)
            ids += [head + prompt_ids + tokens[start:start + room] + tail for start in starts]
            counts.append(len(starts))
        return self.from_ids(ids, prompt), counts

    def from_ids(self, ids, prompt=""):
        """An Encoding of token-id rows, each framed by the special tokens (as `windows` makes them),
        whose first tokens are `prompt`'s: which tokens count in pooling is worked out again."""
        head, tail = self.frame
        skip = 0 if self.include_prompt or not prompt else self._prompt_length(prompt)
        pooled = [[int(i >= skip and not (self.mask_special and (i < len(head) or i >= len(row) - len(tail))))
                   for i in range(len(row))] for row in ids] if skip or self.mask_special else None
        return Encoding(ids, pooled)

    def _all_tokens(self, text):
        """Every token of `text`, no special ones, tokenized SEGMENT_CHARS characters at a time and
        SEGMENTS_AT_ONCE segments per call (a batch call, which lets other threads run meanwhile)."""
        segments, start = [], 0
        while start < len(text):
            end = len(text) if len(text) - start <= SEGMENT_CHARS else start + len(
                _cut_at_whitespace(text[start:start + SEGMENT_CHARS + 1], SEGMENT_CHARS))
            segments.append(text[start:end])
            start = end
        tokens = []
        for first in range(0, len(segments), SEGMENTS_AT_ONCE):
            batch = self._encode_whole(segments[first:first + SEGMENTS_AT_ONCE], add_special_tokens=False)
            tokens += [token for encoded in batch for token in encoded.ids]
        return tokens

    def surely_fit(self, texts, prompt=""):
        """Whether every text, after `prompt`, fits in `truncate_at` tokens whatever the tokenizer: a
        token takes at least one UTF-8 byte, beside the special ones and a word-start marker."""
        room = self.truncate_at - len(self.frame[0]) - len(self.frame[1]) - 1 - len(prompt.encode())
        return all(len(text) <= room and len(text.encode()) <= room for text in texts)

    def tokenize_pairs(self, query, documents):
        """(query, document) pairs as an Encoding with each token's segment (type_ids). A pair too long
        loses the end of its document; a query that leaves no room for any document is a ValueError."""
        if self._pairs is None:  # set once made whole: a worker's tokenizing threads share this object
            pairs = load_fast_tokenizer(self.model_dir)
            pairs.no_padding()
            pairs.enable_truncation(self.truncate_at, strategy="only_second")
            self._pairs = batch_encoder(pairs, self._vocabulary)
        room = self.truncate_at - self._tokenizer.num_special_tokens_to_add(True)
        query_tokens = self._count(self._bounded(query, False), False)  # a prefix of a huge one: enough to refuse
        if query_tokens >= room:
            raise ValueError(f"the query has {query_tokens} tokens, and a pair keeps {self.truncate_at} "
                             "(max_seq_len) with a document's: shorten the query")
        pairs = [(query, self._bounded(document, False)) for document in documents]
        encoded = self._pairs(pairs)
        ids = [row.ids for row in encoded]
        cut = [i for i, row in enumerate(encoded) if row.overflowing]
        truncated = {i: len(self._whole.encode(*pairs[i]).ids) for i in cut}
        return Encoding(ids, [row.attention_mask for row in encoded], None, truncated,
                        [row.type_ids for row in encoded])

    def _bounded(self, item, is_tokenized):
        """`item` (a text, or a list of words), or a prefix of it with the same first `truncate_at`
        tokens when it is too long to tokenize whole."""
        last = 64 if is_tokenized else MAX_CHARS_PER_TOKEN
        size = self._whole_size(is_tokenized)
        while size < len(item):
            prefix = item[:size] if is_tokenized else _cut_at_whitespace(item, size)
            if size >= self.truncate_at * last or self._count(prefix, is_tokenized) > self.truncate_at + MARGIN:
                return prefix
            size *= 4
        return item

    def _whole_size(self, is_tokenized):
        """The length (in characters, or words) up to which `_bounded` keeps an item whole."""
        return (self.truncate_at + MARGIN) * (1 if is_tokenized else CHARS_PER_TOKEN)

    def _count(self, item, is_tokenized):
        return len(self._encode_whole([item], add_special_tokens=False, is_pretokenized=is_tokenized)[0].ids)

    def _truncated(self, texts, encoded, is_tokenized):
        """{index: tokens it had before truncation} for the texts that were cut (for a text cut to a
        prefix first, the prefix's tokens: a lower bound). A text whose ids came from Python says
        so itself (word_pieces.Pieces); others are encoded again, whole."""
        full = [i for i, row in enumerate(encoded) if len(row.ids) >= self.truncate_at]
        lengths = {i: encoded[i].whole_length for i in full if isinstance(encoded[i], Pieces)}
        again = [i for i in full if i not in lengths]
        if again:
            whole = self._encode_whole([texts[i] for i in again], is_pretokenized=is_tokenized)
            lengths.update(zip(again, (len(row.ids) for row in whole)))
        return {i: lengths[i] for i in full if lengths[i] > self.truncate_at}

    def _prompt_length(self, prompt):
        """The prompt's tokens as sentence-transformers counts them: a trailing special token excluded."""
        length = self._prompt_lengths.get(prompt)  # one lookup: another thread may clear the cache
        if length is None:
            if len(self._prompt_lengths) >= 256:  # prompts come from clients: keep the cache bounded
                self._prompt_lengths.clear()
            ids = self._tokenizer.encode(prompt).ids
            length = self._prompt_lengths[prompt] = len(ids) - (bool(ids) and ids[-1] in self.special_ids)
        return length


def window_starts(length, room, overlap):
    """Where each window of a text of `length` tokens starts, when a window holds `room` of them and
    overlaps the one before by `overlap`: every `room - overlap` tokens, the last window being the
    first that reaches the text's end."""
    stride = room - overlap
    return list(range(0, max(length - overlap, 1), stride)) if length > room else [0]


def _cut_at_whitespace(text, size):
    """The first `size` characters of `text`, less the word the cut would split (unless the
    whole prefix is one word)."""
    cut = max(text.rfind(" ", 0, size + 1), text.rfind("\n", 0, size + 1))
    return text[:cut] if cut > 0 else text[:size]


def load_fast_tokenizer(model_dir):
    """The folder's tokenizer.json; without one, the tokenizer transformers builds from the folder."""
    path = Path(model_dir) / "tokenizer.json"
    if path.is_file():
        try:
            return FastTokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception that names no file
            raise ValueError(f"{path} is no tokenizer the tokenizers library can read: {error}") from None
    from transformers import AutoTokenizer
    converted = AutoTokenizer.from_pretrained(model_dir)
    if not hasattr(converted, "backend_tokenizer"):
        raise ValueError(f"{model_dir} has no tokenizer.json, and transformers has no fast tokenizer for it")
    if converted.backend_tokenizer.get_vocab_size() <= len(set(converted.all_special_ids)):
        # without its vocabulary file transformers still builds the tokenizer class that config.json
        # names, knowing only its special tokens: every word would be [UNK]
        wanted = " or ".join(sorted(set(getattr(converted, "vocab_files_names", {}).values()) | {"tokenizer.json"}))
        raise ValueError(f"{model_dir} has no tokenizer files (it needs {wanted}); "
                         "its tokenizer would know no words")
    return FastTokenizer.from_str(converted.backend_tokenizer.to_str())


def pad_token_id(model_dir, tokenizer):
    """The id of the pad token that tokenizer_config.json or special_tokens_map.json names, else 0."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            pad = json.loads((Path(model_dir) / name).read_text()).get("pad_token")
        except (OSError, ValueError, AttributeError):
            continue
        pad = pad.get("content") if isinstance(pad, dict) else pad
        if isinstance(pad, str) and tokenizer.token_to_id(pad) is not None:
            return tokenizer.token_to_id(pad)
    return 0
