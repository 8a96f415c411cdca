"""OpenAI's embeddings API: the request body, its checks, and the response built from the rows."""
import base64
from typing import Any, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictInt

from encoder_client.validation import check_not_blank, check_unicode

from .errors import GatewayError

OWNER = "encoder-server"


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    input: Any
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[StrictInt] = None  # not true, "64" or 64.0
    user: Optional[str] = None  # accepted and ignored, as the API allows
    # ours, as sentence-transformers names them (extra_body in the openai SDK)
    prompt: Optional[str] = None
    prompt_name: Optional[str] = None
    normalize: Optional[bool] = None
    truncate: Optional[bool] = None
    long_texts: Optional[str] = None
    precision: Optional[str] = None

    def model_options(self):
        """What the server is asked for. As OpenAI's, a vector cut to `dimensions` is renormalized."""
        normalize = True if self.normalize is None and self.dimensions is not None else self.normalize
        return {"prompt": self.prompt, "prompt_name": self.prompt_name, "normalize": normalize,
                "truncate": self.truncate, "long_texts": self.long_texts, "dimensions": self.dimensions,
                "precision": self.precision}


def texts_from_input(value):
    """The list of texts in `input`; a 400 naming the problem for anything else."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list):
        raise _bad_input(f"input must be a string or a list of strings, got {type(value).__name__}")
    if not texts:
        raise _bad_input("input must not be an empty list")
    if all(isinstance(item, int) for item in texts) or any(isinstance(item, list) for item in texts):
        raise _bad_input("token-id arrays are not supported by this server yet: send input as a string or a "
                         "list of strings (LangChain's OpenAIEmbeddings: check_embedding_ctx_length=False)")
    for index, text in enumerate(texts):
        where = "input" if isinstance(value, str) else f"input[{index}]"
        if not isinstance(text, str):
            raise _bad_input(f"{where} must be a string, got {type(text).__name__}")
        try:
            check_unicode(text, where)
            check_not_blank(text, where)
        except ValueError as error:
            raise _bad_input(str(error)) from None
    return texts


def check_dimensions(dimensions, width=None):
    """A 400 unless 1 <= dimensions <= width (the model's embedding size, once known)."""
    if dimensions is None:
        return
    if dimensions < 1 or (width is not None and dimensions > width):
        upper = f" and {width}" if width is not None else ""
        raise GatewayError(400, f"dimensions must be between 1{upper}, got {dimensions}", param="dimensions")


def embedding_response(rows, model, num_tokens, encoding_format="float", truncated=0, windows=None):
    """OpenAI's response; ours besides: `truncated`, and with long_texts=chunk each item's `windows`."""
    encode = _as_base64 if encoding_format == "base64" else _as_floats
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": index, "embedding": encode(row),
                  **({"windows": windows[index]} if windows else {})} for index, row in enumerate(rows)],
        "model": model,
        "usage": {"prompt_tokens": num_tokens or 0, "total_tokens": num_tokens or 0},
        "truncated": truncated,  # ours: texts cut at the server's max_seq_len
    }


def model_card(name, created, config=None):
    """OpenAI's model object, plus ours: the model's kind (embed or rerank) and its dimension (floats
    per embedding; 1 for a reranker's score)."""
    config = config or {}
    return {"id": name, "object": "model", "created": created, "owned_by": OWNER,
            "kind": config.get("kind", "embed"), "dimensions": config.get("embedding_dim")}


def model_not_found(model, served=()):
    names = ", ".join(served) or "see GET /v1/models"
    return GatewayError(404, f"The model `{model}` does not exist; this server serves {names}",
                        param="model", code="model_not_found")


def _as_floats(row):
    return np.ascontiguousarray(row)  # ArrayJSONResponse writes it as a list of floats


def _as_base64(row):
    """Little-endian bytes, base64: float32 is what the openai SDK decodes (another precision's bytes
    are its values as served)."""
    return base64.b64encode(row.astype(row.dtype.newbyteorder("<")).tobytes()).decode("ascii")


def _bad_input(message):
    return GatewayError(400, message, param="input")
