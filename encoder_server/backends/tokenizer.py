"""Tokenization with the model's fast tokenizer, truncating (never rejecting) long texts.

The tokenizer's own truncation and padding settings (the bundled tokenizer.json pads everything to
128) are overridden on every call: we truncate at the server's limit and pad later, per pass.
"""
from transformers import AutoTokenizer

from .passes import Encoding


class Tokenizer:
    def __init__(self, model_dir, truncate_at):
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.truncate_at = truncate_at
        self.pad_id = self._tokenizer.pad_token_id or 0

    def tokenize(self, texts, is_tokenized=False, with_tokens=False):
        """Texts (or, with is_tokenized, lists of words) as an Encoding."""
        encoded = self._tokenizer(texts, is_split_into_words=is_tokenized, truncation=True,
                                  max_length=self.truncate_at, padding=False,
                                  return_special_tokens_mask=True, return_token_type_ids=False,
                                  return_attention_mask=False)
        ids = encoded["input_ids"]
        tokens = [self._tokenizer.convert_ids_to_tokens(row) for row in ids] if with_tokens else None
        return Encoding(ids, encoded["special_tokens_mask"], tokens)
