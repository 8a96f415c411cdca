"""Input checks shared by the client and the server, so both reject the same things."""
import functools
import re
import sys
import unicodedata


def check_texts(texts, is_tokenized=False):
    """Raise TypeError/ValueError naming the offending index if `texts` is not encodable."""
    if not isinstance(texts, list):
        raise TypeError(f"texts must be a list, got {type(texts).__name__}")
    if not texts:
        raise ValueError("texts must not be an empty list")
    if is_tokenized:
        for index, words in enumerate(texts):
            _check_words(index, words)
        return
    # every text of every request passes here: the usual one is decided by its first character
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{index}] must be a str, got {type(text).__name__}")
        if not text.isascii():
            check_unicode(text, f"texts[{index}]")
        if not "!" <= text.lstrip()[:1] <= "~":  # not an ASCII letter, digit or sign: look closer
            check_not_blank(text, f"texts[{index}]")


def looks_tokenized(texts):
    """True when every item is a list, i.e. the bert-as-service `is_tokenized` form."""
    return isinstance(texts, list) and bool(texts) and all(isinstance(t, list) for t in texts)


def check_unicode(text, where):
    """ValueError if `text` holds a lone surrogate (valid JSON, but no Unicode character: no
    tokenizer can take it)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:
            raise ValueError(f"{where} holds a lone surrogate (U+{ord(text[error.start]):04X}) at character "
                             f"{error.start}, which is not valid Unicode") from None


def check_not_blank(text, where):
    """ValueError if `text` is empty or holds only whitespace, control or format characters (NUL,
    zero-width spaces and the like): tokenizers drop them all, so it would encode as an empty text."""
    head = text.lstrip()[:1]
    if head and unicodedata.category(head)[0] not in "CZ":  # the usual case, decided by one character
        return
    if _invisible().fullmatch(text):
        raise ValueError(f"{where} is empty or whitespace-only (control and zero-width characters count as "
                         f"whitespace)")


@functools.cache
def _invisible():
    """A pattern for a run of characters that carry no text: whitespace, Cc, Cf, Zs, Zl and Zp."""
    chars = (chr(code) for code in range(sys.maxunicode + 1))
    invisible = "".join(re.escape(char) for char in chars
                        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf", "Zs", "Zl", "Zp"))
    return re.compile(f"[{invisible}]*")


def _check_words(index, words):
    if not isinstance(words, list):
        raise TypeError(f"texts[{index}] must be a list of str when is_tokenized=True, "
                        f"got {type(words).__name__}")
    if not words:
        raise ValueError(f"texts[{index}] is an empty word list")
    for position, word in enumerate(words):
        if not isinstance(word, str):
            raise TypeError(f"texts[{index}][{position}] must be a str, got {type(word).__name__}")
        check_unicode(word, f"texts[{index}][{position}]")
        check_not_blank(word, f"texts[{index}][{position}]")
