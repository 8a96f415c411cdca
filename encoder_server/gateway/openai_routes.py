"""/v1: OpenAI's embeddings and models endpoints."""
from fastapi import APIRouter

from .array_json import ArrayJSONResponse
from .errors import GatewayError
from .limits import RETRY_LATER
from .openai_schema import (EmbeddingRequest, check_dimensions, embedding_response, model_card, model_not_found,
                            shorten, texts_from_input)


def openai_router(link):
    router = APIRouter(prefix="/v1")

    @router.post("/embeddings")
    async def embeddings(body: EmbeddingRequest):
        check_model(link, body.model)
        texts = texts_from_input(body.input)
        if link.token_level:
            raise GatewayError(400, "this server returns token-level embeddings (--pooling-strategy none); "
                                    "use POST /encode for those", param="model")
        check_dimensions(body.dimensions, link.embedding_dim)
        result = await link.encode(texts, **body.model_options())
        rows = shorten(result.embeddings, body.dimensions)
        return ArrayJSONResponse(embedding_response(rows, body.model, result.num_tokens, body.encoding_format,
                                                    result.truncated))

    @router.get("/models")
    async def models():
        served_model(link)
        return {"object": "list", "data": [model_card(name, link.created) for name in link.model_names]}

    @router.get("/models/{model_id:path}")
    async def model(model_id: str):
        check_model(link, model_id)
        return model_card(model_id, link.created)

    return router


def check_model(link, name):
    """A 404 unless `name` is one of the served model's names (503 before the server has said them)."""
    served_model(link)
    if name not in link.model_names:
        raise model_not_found(name, link.model_names)


def served_model(link):
    if link.model is None:
        raise GatewayError(503, link.error or "not connected to the encoder-server yet", code="server_unavailable",
                           headers=RETRY_LATER)
    return link.model
