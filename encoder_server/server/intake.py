"""Checking what a client sent, before any of it is queued. Pure: no sockets.

Anything wrong raises ProtocolError with a message for the client.
"""
import re
from dataclasses import dataclass

from encoder_client.protocol import NOT_FOUND, STREAMED_SINCE, TOO_LARGE, ProtocolError, decode_texts
from encoder_client.request import MODEL_OPTIONS, check_model_options
from encoder_client.validation import check_texts, looks_tokenized

from ..model.outputs import PRECISIONS, Output
from ..model.spec import LONG_TEXTS

MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000  # a week: past it, a client means "no limit" (send none)
# a client's rerank query or prompt longer than this many characters per token of max_seq_len is refused:
# every job carries it, and every text is tokenized with it, so a huge one would be copied once per
# job and once per text (a 20 MB prompt on 256 one-letter texts once took a worker 1.4 GB), and it
# would never leave a text room anyway
MAX_PREFIX_CHARS_PER_TOKEN = 8


@dataclass(frozen=True)
class EncodeRequest:
    identity: bytes
    req_id: int
    texts: list
    is_tokenized: bool
    with_tokens: bool
    timeout_s: float = None  # how long the client waits; work still queued after that is dropped
    options: dict = None     # what it asks of the model (encoder_client.request.MODEL_OPTIONS), checked
    streamed: bool = False   # its client takes a large result in chunks (protocol 2)


def parse_encode(request, show_tokens_allowed, max_texts=None):
    if max_texts is not None:
        _check_lists(request, max_texts)
    texts = decode_texts(request)
    if max_texts is not None and isinstance(texts, list) and len(texts) > max_texts:
        raise ProtocolError(f"{len(texts)} texts in one request is above the server's limit of {max_texts} "
                            "(--max-pending-texts); split the request", request.identity, request.req_id, TOO_LARGE)
    is_tokenized = _flag(request, "is_tokenized", looks_tokenized(texts))
    try:
        check_texts(texts, is_tokenized)
    except (TypeError, ValueError) as error:
        raise ProtocolError(str(error), request.identity, request.req_id) from None
    if request.msg_len != len(texts):
        raise ProtocolError(f"msg_len is {request.msg_len} but the payload holds {len(texts)} texts",
                            request.identity, request.req_id)
    return EncodeRequest(request.identity, request.req_id, texts, is_tokenized,
                         _with_tokens(request, show_tokens_allowed), _timeout(request), _model_options(request),
                         _streamed(request))


def _check_lists(request, max_texts):
    """Refuse, before parsing, a payload with more JSON lists and objects than any admissible
    request has (the outer list, and one word list per text): parsing millions of them, as in
    `[[],[],...]`, once held the ventilator for 15 s and took 3.9 GB. The brackets are counted
    fast, and counted again outside strings only when there seem to be too many, and only when
    that is cheap: a payload with millions of strings or escapes besides is refused as it is."""
    payload, limit = request.payload, max_texts + 1
    nested = payload.count(b"[") + payload.count(b"{")
    if nested <= limit:
        return
    marks = payload.count(b'"') + payload.count(b"\\")
    if marks <= MAX_MARKS_RECOUNTED:
        structure = _JSON_STRING.sub(b"", payload)
        nested = structure.count(b"[") + structure.count(b"{")
        if nested <= limit:
            return
        raise ProtocolError(f"payload holds {nested} JSON lists or objects; a request has at most {limit} (the "
                            "list of texts, and one word list per text)", request.identity, request.req_id,
                            TOO_LARGE)
    raise ProtocolError(f"payload holds {nested} brackets and {marks} quotes or backslashes, too many to check "
                        "before parsing; split the request", request.identity, request.req_id, TOO_LARGE)


MAX_MARKS_RECOUNTED = 2_000_000  # quotes and backslashes: the recount's cost grows with them (about 0.6 s here)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, unrolled so that sre runs it fast


def check_result_size(request, settings):
    """ProtocolError (too_large) when the float32 result of `request` could pass --max-result-mb:
    the server would have to hold it, and its client to read it, in one piece. A sparse row counts
    at its most: 8 bytes for each of its top_k entries, or each of the vocabulary's."""
    rows_per_text = settings.truncate_at if settings.pooling.token_level else 1
    if settings.kind == "sparse":
        size = len(request.texts) * 8 * min(settings.embedding_dim, _top_k(request, settings) or settings.embedding_dim)
    else:
        size = len(request.texts) * rows_per_text * settings.embedding_dim * 4
    if size > settings.max_result_mb << 20:
        per_text = "texts at up to %d tokens each" % rows_per_text if rows_per_text > 1 else "texts"
        advice = ", or ask for fewer entries per row (top_k)" if settings.kind == "sparse" else ""
        raise ProtocolError(f"the result of {len(request.texts)} {per_text} could take {size / 2**20:.0f} MB, "
                            f"above the server's limit of {settings.max_result_mb} MB (--max-result-mb); split "
                            f"the request{advice}", request.identity, request.req_id, TOO_LARGE)


def served_model(request, served):
    """(index, Settings) of the model that an EncodeRequest names among `served`; one that names
    none goes to the default model (the first), or with a query to the first reranker.
    ProtocolError (not_found) for a name no model has, and for a query to an embedding model or
    texts without one to a reranker."""
    name, reranking = (request.options or {}).get("model"), (request.options or {}).get("query") is not None
    if name is None:
        index = next((i for i, model in enumerate(served) if model.kind == "rerank"), 0) if reranking else 0
    else:
        index = model_index(served, name)
    if index is None:
        names = ", ".join(model.name for model in served)
        raise ProtocolError(f"model {name[:100]!r} is not served here; the models are: {names}", request.identity,
                            request.req_id, NOT_FOUND)
    model = served[index]
    if reranking != (model.kind == "rerank"):
        wanted = "a query and documents to rerank" if model.kind == "rerank" else "texts to embed"
        raise ProtocolError(f"model {model.name!r} is a{' reranker' if model.kind == 'rerank' else 'n embedder'}: "
                            f"send it {wanted}", request.identity, request.req_id)
    if reranking and (request.is_tokenized or request.with_tokens):
        raise ProtocolError("a rerank request takes texts, not word lists, and gives no tokens", request.identity,
                            request.req_id)
    return index, model


def model_index(served, name):
    """The index of the model among `served` that answers to `name`; None when none does."""
    return next((index for index, model in enumerate(served) if name in model.model_name), None)


def model_choices(request, settings, handling=None):
    """The Job fields (prompt, normalize, truncate; a reranker's query and raw_scores, a sparse model's
    top_k) for an EncodeRequest to a model with `settings`: the request's options, else the model's
    defaults. `handling`: what its long texts become (long_texts), if the caller knows it already.
    ProtocolError for an unknown prompt name."""
    options = request.options or {}
    truncate = (handling or long_texts(request, settings)) != "error"
    if settings.kind == "rerank":
        if options.get("prompt") or options.get("prompt_name") or options.get("normalize"):
            raise ProtocolError("a rerank request takes no prompt or normalize", request.identity, request.req_id)
        _check_prefix("query", options["query"], request, settings, "a pair of ")
        return {"query": options["query"], "raw_scores": options.get("raw_scores", False), "truncate": truncate}
    prompt = options.get("prompt")
    if prompt is not None:
        _check_prefix("prompt", prompt, request, settings)
    if prompt is None and options.get("prompt_name") is not None:
        prompt = settings.prompts.get(options["prompt_name"])
        if prompt is None:
            known = ", ".join(settings.prompts) or "none"
            raise ProtocolError(f"prompt_name {options['prompt_name'][:100]!r} is not one of the model's prompts "
                                f"(it has: {known})", request.identity, request.req_id)
    if prompt and request.is_tokenized:
        raise ProtocolError("a prompt applies to texts, not to word lists (is_tokenized)", request.identity,
                            request.req_id)
    if prompt is None and not request.is_tokenized:
        prompt = settings.prompts.get(settings.default_prompt_name, "")
    choices = {"prompt": prompt or "", "normalize": options.get("normalize", settings.normalize), "truncate": truncate}
    top_k = _top_k(request, settings)
    return {**choices, "top_k": top_k} if settings.kind == "sparse" else choices


def _check_prefix(name, text, request, settings, holder=""):
    """Refuse a client's query or prompt (`name`) far longer than max_seq_len tokens hold."""
    if len(text) > MAX_PREFIX_CHARS_PER_TOKEN * settings.truncate_at:
        raise ProtocolError(f"the {name} has {len(text)} characters, far more than {holder}{settings.truncate_at} "
                            f"tokens (max_seq_len) hold: shorten the {name}", request.identity, request.req_id,
                            TOO_LARGE)


def _top_k(request, settings):
    """A sparse model's cap on a row's entries: the request's top_k, else the model's max_active_dims."""
    top_k = (request.options or {}).get("top_k")
    if top_k is None:
        return settings.max_active_dims if settings.kind == "sparse" else None
    if settings.kind != "sparse":
        raise ProtocolError(f"top_k applies to a sparse model; model {settings.name!r} gives "
                            f"{'vectors' if settings.kind == 'embed' else 'scores'}", request.identity, request.req_id)
    if top_k < 1:
        raise ProtocolError(f"top_k must be at least 1, got {top_k}", request.identity, request.req_id)
    return top_k


def long_texts(request, settings):
    """What a text longer than max_seq_len becomes: truncate, error or chunk, as the request says
    (`truncate=False` is error), else as the server's --long-texts says (chunk only where it can)."""
    options = request.options or {}
    chosen = options.get("long_texts")
    if chosen is not None and chosen not in LONG_TEXTS:
        raise ProtocolError(f"long_texts must be one of {', '.join(LONG_TEXTS)}, got {chosen[:32]!r}",
                            request.identity, request.req_id)
    if options.get("truncate") is False:
        if chosen not in (None, "error"):
            raise ProtocolError(f"truncate=false and long_texts={chosen} contradict each other", request.identity,
                                request.req_id)
        return "error"
    if chosen == "chunk" and not can_chunk(request, settings):
        raise ProtocolError("long_texts=chunk takes texts (not word lists, no tokens shown) for an embedding model "
                            "that pools one vector per text", request.identity, request.req_id)
    if chosen is None:
        chosen = settings.long_texts if settings.long_texts != "chunk" or can_chunk(request, settings) else "truncate"
    return chosen


def can_chunk(request, settings):
    """Whether a request's long texts can be embedded whole: texts (not word lists, no tokens shown)
    for a model of one vector per text."""
    return settings.pools_one_vector and not (request.is_tokenized or request.with_tokens)


def output_of(request, settings):
    """The Output (model.outputs) that a request's `dimensions`, `precision` and `normalize` ask
    for, its windows and int8 ranges not yet known. ProtocolError for a value out of bounds."""
    options = request.options or {}
    dimensions, precision = options.get("dimensions"), options.get("precision", "float32")
    if precision not in PRECISIONS:
        raise ProtocolError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision[:32]!r}",
                            request.identity, request.req_id)
    if (dimensions is not None or precision != "float32") and not settings.pools_one_vector:
        raise ProtocolError(f"dimensions and precision apply to the vectors of an embedding model; model "
                            f"{settings.name!r} gives {_gives(settings)}", request.identity, request.req_id)
    if dimensions is not None and not 1 <= dimensions <= settings.embedding_dim:
        raise ProtocolError(f"dimensions must be from 1 to the model's {settings.embedding_dim}, got {dimensions}",
                            request.identity, request.req_id)
    return Output(dimensions=None if dimensions == settings.embedding_dim else dimensions,
                  normalize=options.get("normalize", settings.normalize), precision=precision)


def _gives(settings):
    return "a vector per token" if settings.kind == "embed" else f"{settings.kind} results"


def _model_options(request):
    model_options = {name: request.options.get(name) for name in MODEL_OPTIONS}
    try:
        return check_model_options(model_options)
    except (TypeError, ValueError) as error:
        raise ProtocolError(str(error), request.identity, request.req_id) from None


def _timeout(request):
    value = request.options.get("timeout_ms")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT_MS:
        raise ProtocolError(f"timeout_ms must be a number of milliseconds above 0 and at most {MAX_TIMEOUT_MS}, "
                            f"got {str(value)[:32]}", request.identity, request.req_id)
    return value / 1000


def _streamed(request):
    version = request.options.get("v")
    return isinstance(version, int) and not isinstance(version, bool) and version >= STREAMED_SINCE


def _flag(request, name, default):
    value = request.options.get(name, default)
    if not isinstance(value, bool):
        raise ProtocolError(f"{name} must be true or false, got {type(value).__name__}", request.identity,
                            request.req_id)
    return value


def _with_tokens(request, allowed):
    if "show_tokens" not in request.options:
        return allowed  # bert-as-service's client: tokens come whenever the server allows them
    if _flag(request, "show_tokens", False) and not allowed:
        raise ProtocolError("show_tokens is disabled on this server (start it with --show-tokens-to-client)",
                            request.identity, request.req_id)
    return request.options["show_tokens"]
