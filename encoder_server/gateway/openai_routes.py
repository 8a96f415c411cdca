"""/v1: OpenAI's embeddings and models endpoints."""
from fastapi import APIRouter

from encoder_client.protocol import TOKEN_LEVEL

from .array_json import ArrayJSONResponse
from .errors import GatewayError
from .limits import RETRY_LATER
from .openai_schema import (EmbeddingRequest, check_dimensions, embedding_response, model_card, model_not_found,
                            texts_from_input)


def openai_router(link):
    router = APIRouter(prefix="/v1")

    @router.post("/embeddings")
    async def embeddings(body: EmbeddingRequest):
        model = check_model(link, body.model)
        texts = texts_from_input(body.input)
        if model.get("kind", "embed") != "embed":
            route = "/v1/rerank" if model["kind"] == "rerank" else "/embed_sparse"
            raise GatewayError(400, f"the model `{body.model}` is of kind {model['kind']}: POST {route}",
                               param="model")
        if model.get("pooling_strategy") == TOKEN_LEVEL:
            raise GatewayError(400, "this model returns token-level embeddings (--pooling-strategy none); "
                                    "use POST /encode for those", param="model")
        check_dimensions(body.dimensions, model.get("embedding_dim"))
        result = await link.encode(texts, model=model["model_name"], **body.model_options())
        return ArrayJSONResponse(embedding_response(result.embeddings, body.model, result.num_tokens,
                                                    body.encoding_format, result.truncated, result.windows))

    @router.get("/models")
    async def models():
        connected(link)
        return {"object": "list", "data": [model_card(name, link.created, model) for model in link.models
                                           for name in model.get("model_names") or [model["model_name"]]]}

    @router.get("/models/{model_id:path}")
    async def model(model_id: str):
        return model_card(model_id, link.created, check_model(link, model_id))

    return router


def check_model(link, name):
    """The config entry of the model named `name`: a 404 unless one of the served models answers to
    it (503 before the server has said them)."""
    connected(link)
    model = link.model_named(name)
    if model is None:
        raise model_not_found(name, link.model_names)
    return model


WHAT_IT_DOES = {"embed": "embeds", "rerank": "reranks", "sparse": "gives sparse vectors"}


def model_of_kind(link, name, kind):
    """The config entry of the model of `kind` named `name` (None: the first of that kind served);
    404 for an unknown name, 400 for a model of another kind."""
    connected(link)
    model = link.first_of_kind(kind) if name is None else link.model_named(name)
    if model is None and name is None:
        raise GatewayError(404, f"this server serves no model of kind {kind}", param="model", code="model_not_found")
    if model is None:
        raise model_not_found(name, link.model_names)
    if model.get("kind", "embed") != kind:
        raise GatewayError(400, f"the model `{name}` {WHAT_IT_DOES[model.get('kind', 'embed')]}; this route takes a "
                                f"model of kind {kind}", param="model")
    return model


def connected(link):
    if link.model is None:
        raise GatewayError(503, link.error or "not connected to the encoder-server yet", code="server_unavailable",
                           headers=RETRY_LATER)
