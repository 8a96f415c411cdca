"""Tokenization with the model's fast tokenizer: prompts prepended, long texts truncated (and
counted), and which tokens count in pooling.

The tokenizer's own truncation and padding settings (the bundled tokenizer.json pads everything to
128) are overridden on every call: we truncate at the server's limit and pad later, per pass.

A tokenizer's memory grows with its input (about 100 bytes per character), whatever the limit, so
a text far longer than `truncate_at` tokens is first cut to a prefix that still has more than
`truncate_at` tokens, ending at whitespace: its first `truncate_at` tokens, all that is kept, are
the same as the whole text's. The prefix starts at CHARS_PER_TOKEN characters per token allowed
and grows while it has too few tokens, up to MAX_CHARS_PER_TOKEN, where a text (whitespace or
junk that yields almost no tokens) is cut regardless.
"""
from transformers import AutoTokenizer

from .passes import Encoding

CHARS_PER_TOKEN = 8          # the first prefix tried: enough for almost any real text
MAX_CHARS_PER_TOKEN = 1024   # the longest prefix: past it, a text is cut regardless
MARGIN = 8                   # tokens beyond the limit a prefix must have, so a cut word can't matter


class Tokenizer:
    def __init__(self, model_dir, truncate_at, mask_special=False, include_prompt=True):
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.truncate_at = truncate_at
        self.mask_special = mask_special      # leave [CLS] and [SEP] out of pooling
        self.include_prompt = include_prompt  # whether a prompt's tokens count in pooling
        self.pad_id = self._tokenizer.pad_token_id or 0
        self.vocab_size = len(self._tokenizer)
        self._prompt_lengths = {}

    def tokenize(self, texts, is_tokenized=False, with_tokens=False, prompt=""):
        """Texts (or, with is_tokenized, lists of words) as an Encoding, each prefixed by `prompt`."""
        if prompt:
            texts = [prompt + text for text in texts]
        texts = [self._bounded(item, is_tokenized) for item in texts]
        encoded = self._encode(texts, is_tokenized, truncate=True)
        ids, special = encoded["input_ids"], encoded["special_tokens_mask"]
        skip = 0 if self.include_prompt or not prompt else self._prompt_length(prompt)
        pooled = [[int(i >= skip and not (self.mask_special and s)) for i, s in enumerate(row)] for row in special]
        tokens = [self._tokenizer.convert_ids_to_tokens(row) for row in ids] if with_tokens else None
        return Encoding(ids, pooled, tokens, self._truncated(texts, ids, is_tokenized))

    def _encode(self, texts, is_tokenized, truncate):
        return self._tokenizer(texts, is_split_into_words=is_tokenized, truncation=truncate,
                               max_length=self.truncate_at if truncate else None, padding=False,
                               return_special_tokens_mask=True, return_token_type_ids=False,
                               return_attention_mask=False, verbose=False)

    def _bounded(self, item, is_tokenized):
        """`item` (a text, or a list of words), or a prefix of it with the same first `truncate_at`
        tokens when it is too long to tokenize whole."""
        per_token, last = (1, 64) if is_tokenized else (CHARS_PER_TOKEN, MAX_CHARS_PER_TOKEN)
        size = (self.truncate_at + MARGIN) * per_token
        while size < len(item):
            prefix = item[:size] if is_tokenized else _cut_at_whitespace(item, size)
            if size >= self.truncate_at * last or self._count(prefix, is_tokenized) > self.truncate_at + MARGIN:
                return prefix
            size *= 4
        return item

    def _count(self, item, is_tokenized):
        return len(self._tokenizer(item, is_split_into_words=is_tokenized, add_special_tokens=False,
                                   verbose=False)["input_ids"])

    def _truncated(self, texts, ids, is_tokenized):
        """{index: tokens it had before truncation} for the texts that were cut (for a text cut to a
        prefix first, the prefix's tokens: a lower bound)."""
        full = [i for i, row in enumerate(ids) if len(row) >= self.truncate_at]
        if not full:
            return {}
        lengths = [len(row) for row in self._encode([texts[i] for i in full], is_tokenized, False)["input_ids"]]
        return {i: length for i, length in zip(full, lengths) if length > self.truncate_at}

    def _prompt_length(self, prompt):
        """The prompt's tokens as sentence-transformers counts them: a trailing special token excluded."""
        if prompt not in self._prompt_lengths:
            if len(self._prompt_lengths) >= 256:  # prompts come from clients: keep the cache bounded
                self._prompt_lengths.clear()
            ids = self._tokenizer([prompt], truncation=True, max_length=self.truncate_at)["input_ids"][0]
            trailing_special = bool(ids) and ids[-1] in self._tokenizer.all_special_ids
            self._prompt_lengths[prompt] = len(ids) - trailing_special
        return self._prompt_lengths[prompt]


def _cut_at_whitespace(text, size):
    """The first `size` characters of `text`, less the word the cut would split (unless the
    whole prefix is one word)."""
    cut = max(text.rfind(" ", 0, size + 1), text.rfind("\n", 0, size + 1))
    return text[:cut] if cut > 0 else text[:size]
