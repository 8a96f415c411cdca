"""/v1: OpenAI's embeddings and models endpoints."""
from fastapi import APIRouter, Depends

from .array_json import ArrayJSONResponse
from .errors import GatewayError
from .openai_schema import (EmbeddingRequest, check_dimensions, embedding_response, model_card, model_not_found,
                            shorten, texts_from_input)


def openai_router(link, check_key):
    router = APIRouter(prefix="/v1", dependencies=[Depends(check_key)])

    @router.post("/embeddings")
    async def embeddings(body: EmbeddingRequest):
        served = served_model(link)
        if body.model != served:
            raise model_not_found(body.model)
        texts = texts_from_input(body.input)
        if link.token_level:
            raise GatewayError(400, "this server returns token-level embeddings (--pooling-strategy none); "
                                    "use POST /encode for those", param="model")
        check_dimensions(body.dimensions, link.embedding_dim)
        result = await link.encode(texts)
        rows = shorten(result.embeddings, body.dimensions)
        return ArrayJSONResponse(embedding_response(rows, served, result.num_tokens, body.encoding_format))

    @router.get("/models")
    async def models():
        return {"object": "list", "data": [model_card(served_model(link), link.created)]}

    @router.get("/models/{model_id:path}")
    async def model(model_id: str):
        if model_id != served_model(link):
            raise model_not_found(model_id)
        return model_card(model_id, link.created)

    return router


def served_model(link):
    if link.model is None:
        raise GatewayError(503, link.error or "not connected to the encoder-server yet", code="server_unavailable",
                           headers={"Retry-After": "1"})
    return link.model
