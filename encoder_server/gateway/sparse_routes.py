"""POST /embed_sparse in text-embeddings-inference's shape: {"inputs": text or texts} -> for each
text, its non-zero vocabulary entries [{"index", "value"}], ascending by index. Ours besides:
`model` (which sparse model; default the first served), `top_k` (each text's largest entries only)
and `return_tokens` (each entry's vocabulary token, as "token")."""
from typing import Any, Optional

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from .openai_routes import model_of_kind
from .openai_schema import texts_from_input


class SparseRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    inputs: Any
    truncate: Optional[StrictBool] = None  # False: a text longer than max_seq_len fails the request
    prompt_name: Optional[StrictStr] = None
    model: Optional[StrictStr] = None
    top_k: Optional[StrictInt] = None
    return_tokens: StrictBool = False


def sparse_router(link):
    router = APIRouter()

    @router.post("/embed_sparse")
    async def embed_sparse(body: SparseRequest):
        model = model_of_kind(link, body.model, "sparse")
        texts = texts_from_input(body.inputs)
        result = await link.encode(texts, show_tokens=body.return_tokens, model=model["model_name"],
                                   truncate=body.truncate, prompt_name=body.prompt_name, top_k=body.top_k)
        vectors = result.embeddings
        return [_entries(*vectors.row(i), result.tokens[i] if body.return_tokens else None)
                for i in range(len(vectors))]

    return router


def _entries(indices, values, tokens=None):
    entries = [{"index": int(index), "value": float(value)} for index, value in zip(indices, values)]
    if tokens is not None:
        for entry, token in zip(entries, tokens):
            entry["token"] = token
    return entries
