"""What both clients send, and how they pace retries and the connection handshake. Pure: no sockets."""
import os
import secrets
import struct

from .errors import RequestTooLargeError
from .json_frames import to_json
from .validation import check_not_blank, check_texts, check_unicode

CONNECT_TIMEOUT = 10.0     # the handshake's limit when the client's timeout is None
HANDSHAKE_INTERVAL = 0.25  # a SHOW_CONFIG is re-sent this often until the server answers
RETRY_PAUSE = (0.1, 2.0)   # first and longest pause between resends


# what an encode request may ask of the model, as sentence-transformers names it, and its type: `model`
# names one of the server's models (None: its default), `query` and `raw_scores` are a rerank request's;
# `long_texts`, `dimensions` and `precision` shape what is served (the server checks their values), and
# `top_k` caps a sparse model's non-zero entries per row
MODEL_OPTIONS = {"prompt": str, "prompt_name": str, "normalize": bool, "truncate": bool, "model": str,
                 "query": str, "raw_scores": bool, "long_texts": str, "dimensions": int, "precision": str,
                 "top_k": int}


def check_model_options(options):
    """The options that are set (not None); TypeError naming one of the wrong type or unknown."""
    chosen = {name: value for name, value in options.items() if value is not None}
    for name, value in chosen.items():
        if name not in MODEL_OPTIONS:
            raise TypeError(f"unknown encode option {name!r}; the options are {', '.join(MODEL_OPTIONS)}")
        if not isinstance(value, MODEL_OPTIONS[name]) or (isinstance(value, bool) and MODEL_OPTIONS[name] is int):
            raise TypeError(f"{name} must be a {MODEL_OPTIONS[name].__name__}, got {type(value).__name__}")
        if isinstance(value, str):
            check_unicode(value, name)
    if "query" in chosen:
        check_not_blank(chosen["query"], "query")
    return chosen


def prepare_encode(texts, is_tokenized=False, show_tokens=False, timeout=None, max_request_bytes=None,
                   **model_options):
    """(payload, msg_len, options) of an encode request; raises TypeError/ValueError for bad input,
    RequestTooLargeError (a ValueError) above the server's size limit. `model_options`: prompt,
    prompt_name, normalize and truncate (see MODEL_OPTIONS); None leaves one to the server."""
    check_texts(texts, is_tokenized)
    chosen = check_model_options(model_options)
    payload = to_json(texts)
    if max_request_bytes and len(payload) > max_request_bytes:
        raise RequestTooLargeError(f"the request is {len(payload) >> 20} MB, above the server's limit of "
                                   f"{max_request_bytes >> 20} MB (--max-request-mb); split it")
    options = {"is_tokenized": is_tokenized, "show_tokens": show_tokens, **chosen}
    if timeout is not None:
        options["timeout_ms"] = timeout * 1000
    return payload, len(texts), options


def new_req_id():
    """A fresh request number: random, so that no other peer can guess it and pass off a reply as
    this request's (a reply is matched to its request by identity and number). They are drawn from
    the OS's generator a batch at a time, a system call per REQ_IDS_PER_DRAW requests, not one each."""
    global _fresh_req_ids
    try:
        return next(_fresh_req_ids)  # one step of a C iterator: safe between threads
    except StopIteration:
        _fresh_req_ids = iter(struct.unpack(f"<{REQ_IDS_PER_DRAW}Q", secrets.token_bytes(8 * REQ_IDS_PER_DRAW)))
        return next(_fresh_req_ids)


def _forget_drawn_req_ids():
    """A forked child draws its own numbers, never the ones its parent has still to use."""
    global _fresh_req_ids
    _fresh_req_ids = iter(())


REQ_IDS_PER_DRAW = 256
_forget_drawn_req_ids()
if hasattr(os, "register_at_fork"):  # (no fork, and no such hook, on Windows)
    os.register_at_fork(after_in_child=_forget_drawn_req_ids)


def max_request_bytes(config):
    """The request size limit a server announces in SHOW_CONFIG, in bytes (None: unknown)."""
    megabytes = announced(config, "max_request_mb")
    return None if megabytes is None else megabytes << 20


def announced(config, name):
    """The limit a server's SHOW_CONFIG reply announces under `name`: a positive integer, or None
    where it announces none (or anything else: a reply from no encoder-server)."""
    value = config.get(name) if isinstance(config, dict) else None
    return value if type(value) is int and value > 0 else None


def retry_pause(attempt):
    return min(RETRY_PAUSE[0] * 2 ** attempt, RETRY_PAUSE[1])
