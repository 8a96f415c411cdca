"""Whether a model folder's tokenizer and weights files are there and whole, checked at start-up in
milliseconds: a missing or truncated file is one ConfigError naming it, where the ONNX export or
each worker in turn would find it (with the torch backend, 3 failed starts of ~10 s each).
"""
import contextlib
import zipfile

from .model_folder import ConfigError

# what a tokenizer is built from: tokenizer.json, or the vocabulary files that transformers' tokenizer
# classes name (vocab_files_names: WordPiece's vocab.txt, BPE's vocab.json and merges.txt,
# SentencePiece's *.model...); each class that names another file (emoji.json...) names one of these too
TOKENIZER_FILES = ("tokenizer.json", "*vocab*", "merges*", "*.model", "*.spm", "bpe.codes", "dict.txt")


def check_model_files(path, transformer_path):
    """ConfigError for the first file of the folder `path` (its Transformer module in
    `transformer_path`) that is missing or not whole."""
    _check_tokenizer_files(path, transformer_path)
    _check_weights(path, transformer_path)


@contextlib.contextmanager
def open_weights(file, context=""):
    """A safetensors file opened to read its header (safetensors' safe_open, numpy tensors); a file
    that cannot be, as a truncated copy cannot (safetensors checks that its header covers the whole
    file), is a ConfigError that names it, after `context`."""
    from safetensors import SafetensorError, safe_open
    try:
        weights = safe_open(file, "np")
    except (SafetensorError, OSError) as error:
        raise ConfigError(f"{context}{file}: not readable as safetensors ({error}); copy or download it "
                          "again") from None
    with weights:
        yield weights


def _check_weights(path, transformer_path):
    """ConfigError for safetensors weights or a torch checkpoint that is not whole."""
    for file in sorted(transformer_path.glob("*.safetensors")):
        with open_weights(file, f"--model {path}: "):
            pass
    for file in sorted(transformer_path.glob("*.bin")):
        if file.is_file() and _zip_cut_short(file):  # (a folder of that name is no checkpoint to check)
            raise ConfigError(f"--model {path}: {file}: cut short (a zip archive without its end record); copy "
                              "or download it again")


def _zip_cut_short(file):
    """Whether a torch checkpoint in zip form (torch.save's since torch 1.6) lacks the record that
    ends a zip archive, as a truncated copy does (only its last bytes are read). A checkpoint in
    torch's older form, a bare pickle, is not checked."""
    with open(file, "rb") as handle:
        if handle.read(4) != b"PK\x03\x04":
            return False
    return not zipfile.is_zipfile(file)


def _check_tokenizer_files(path, transformer_path):
    """ConfigError for a folder that no tokenizer can be built from: without one, transformers builds
    a tokenizer that knows only its special tokens, so every word would be [UNK] (the workers' own
    check, model/tokenizer.py, is exact but needs transformers; this one needs no import)."""
    if not any(next(transformer_path.glob(pattern), None) for pattern in TOKENIZER_FILES):
        where = "" if transformer_path == path else f" (in {transformer_path.name}/)"
        raise ConfigError(f"--model {path}: no tokenizer files{where}; it needs tokenizer.json or a vocabulary "
                          "such as vocab.txt, else its tokenizer would know no words")
    if _cut_short(transformer_path / "tokenizer.json"):
        raise ConfigError(f"--model {path}: {transformer_path / 'tokenizer.json'}: cut short (its JSON object "
                          "never ends); copy or download it again")


def _cut_short(path):
    """Whether a JSON file that is there ends before its closing brace, as a truncated copy does (its
    last bytes are read, not the whole file: a tokenizer.json can take megabytes, and so would its
    parse in the supervisor)."""
    if not path.is_file():
        return False
    with open(path, "rb") as handle:
        handle.seek(max(0, handle.seek(0, 2) - 64))
        return not handle.read().rstrip().endswith(b"}")
