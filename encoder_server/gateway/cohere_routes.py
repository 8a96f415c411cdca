"""POST /v2/embed in Cohere's shape (the cohere SDK's ClientV2.embed): `embedding_types` are the
precisions served (float, int8, uint8, binary, ubinary, as sentence-transformers' quantize_embeddings
makes them: model.outputs), `input_type` picks the model's prompt of that purpose, `output_dimension`
cuts each vector (Matryoshka) and `truncate` says what a long text becomes: END (cut it), NONE
(refuse it), or ours, CHUNK (embed it whole). Each type is its own request to the server."""
import asyncio
import uuid
from typing import Any, List, Optional

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

from .array_json import ArrayJSONResponse
from .errors import GatewayError
from .openai_routes import model_of_kind
from .openai_schema import check_dimensions, texts_from_input

EMBEDDING_TYPES = {"float": "float32", "int8": "int8", "uint8": "uint8", "binary": "binary", "ubinary": "ubinary"}
LONG_TEXTS = {"END": "truncate", "NONE": "error", "CHUNK": "chunk"}
# the prompt names that serve each input type, first found first
PROMPTS = {"search_query": ("query", "search_query"), "search_document": ("document", "passage", "search_document"),
           "classification": ("classification",), "clustering": ("clustering",)}


class CohereEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    texts: Optional[List[Any]] = None
    inputs: Optional[List[Any]] = None  # Cohere's mixed inputs: only their text parts are taken
    model: Optional[StrictStr] = None
    input_type: Optional[StrictStr] = None
    embedding_types: List[StrictStr] = ["float"]
    output_dimension: Optional[StrictInt] = None
    truncate: StrictStr = "END"
    max_tokens: Any = None  # accepted and ignored: texts are cut at the model's max_seq_len


def cohere_router(link):
    router = APIRouter()

    @router.post("/v2/embed")
    async def embed(body: CohereEmbedRequest):
        model = model_of_kind(link, body.model, "embed")
        texts = texts_from_input(_texts(body))
        check_dimensions(body.output_dimension, model.get("embedding_dim"))
        options = {"model": model["model_name"], "prompt_name": prompt_name(body.input_type, model),
                   "long_texts": long_texts(body.truncate), "dimensions": body.output_dimension}
        types = embedding_types(body.embedding_types)
        results = await asyncio.gather(*(link.encode(texts, precision=EMBEDDING_TYPES[kind], **options)
                                         for kind in types))
        return ArrayJSONResponse({
            "id": str(uuid.uuid4()), "response_type": "embeddings_by_type", "texts": texts,
            "embeddings": {kind: result.embeddings for kind, result in zip(types, results)},
            "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": results[0].num_tokens or 0}}})

    return router


def _texts(body):
    if body.inputs is None:
        return body.texts
    try:
        return [part["text"] for item in body.inputs for part in item["content"] if part.get("type") == "text"]
    except (TypeError, KeyError, AttributeError):
        raise GatewayError(400, 'inputs must be objects {"content": [{"type": "text", "text": ...}]}',
                           param="inputs") from None


def prompt_name(input_type, model):
    """The model's prompt for `input_type` (None: the model's default prompt)."""
    if input_type is None:
        return None
    if input_type not in PROMPTS:
        raise GatewayError(400, f"input_type must be one of {', '.join(PROMPTS)}, got {input_type[:32]!r}",
                           param="input_type")
    prompts = model.get("prompts") or {}
    return next((name for name in PROMPTS[input_type] if name in prompts), None)


def long_texts(truncate):
    if truncate.upper() not in LONG_TEXTS:
        raise GatewayError(400, f"truncate must be one of {', '.join(LONG_TEXTS)} (START is not supported), got "
                                f"{truncate[:32]!r}", param="truncate")
    return LONG_TEXTS[truncate.upper()]


def embedding_types(types):
    if not types:
        raise GatewayError(400, "embedding_types must name at least one type", param="embedding_types")
    unknown = [kind for kind in types if kind not in EMBEDDING_TYPES]
    if unknown:
        raise GatewayError(400, f"embedding_types must be among {', '.join(EMBEDDING_TYPES)}, got "
                                f"{str(unknown[0])[:32]!r}", param="embedding_types")
    return list(dict.fromkeys(types))
