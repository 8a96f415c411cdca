"""The reranker against sentence-transformers' CrossEncoder: the same scores (with the folder's
activation, and raw), the same order, on two architectures and both backends; document-side
truncation; and the spec's checks of what can rerank."""
import numpy as np
import pytest
import torch

from conftest import WORDS, build_tiny_bert, build_tiny_cross_encoder, random_texts
from encoder_server.model import load
from encoder_server.model.model_folder import ConfigError
from encoder_server.model.spec import ModelSpec, resolve_spec

QUERY = "a cat on the road by the river"
DOCUMENTS = ["the dog ran", "a cat is here on the road", "sun moon star", "x", *random_texts(20, seed=3),
             "Die Katze schläft 🙂 — “quotes”"]


@pytest.fixture(scope="module", params=["bert", "distilbert"])
def cross_encoder(request, tmp_path_factory):
    return build_tiny_cross_encoder(tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}",
                                    request.param, seed=5)


def predict(folder, query, documents, activation=None):
    from sentence_transformers import CrossEncoder
    model = CrossEncoder(str(folder), device="cpu")
    options = {} if activation is None else {"activation_fn": activation}
    return model.predict([(query, document) for document in documents], **options), model


@pytest.mark.parametrize("backend", ["onnx", "torch"])
def test_scores_and_order_equal_cross_encoder_predict_and_rank(cross_encoder, backend):
    reference, model = predict(cross_encoder, QUERY, DOCUMENTS)
    raw_reference, _ = predict(cross_encoder, QUERY, DOCUMENTS, torch.nn.Identity())
    reranker = load(str(cross_encoder), backend=backend)
    assert reranker.spec.kind == "rerank" and reranker.spec.score_activation.endswith("Sigmoid")
    scores = reranker.score(QUERY, DOCUMENTS)
    raw = reranker.score(QUERY, DOCUMENTS, raw=True)
    assert np.abs(scores - reference).max() <= 1e-4
    assert np.abs((raw - raw_reference) / np.maximum(np.abs(raw_reference), 1e-3)).max() <= 1e-3
    assert raw.std() > 1e-2  # the scores differ enough for the order to mean something
    ranks = model.rank(QUERY, DOCUMENTS)
    assert list(np.argsort(-scores, kind="stable")) == [rank["corpus_id"] for rank in ranks]


def test_a_long_document_loses_its_end_and_the_query_stays_whole(tiny_cross_encoder):
    reranker = load(str(tiny_cross_encoder))
    limit = reranker.spec.truncate_at
    long_document = " ".join(WORDS * 4)
    encoding = reranker.tokenize([long_document, "short"], query=QUERY)
    assert len(encoding.ids[0]) == limit and 0 in encoding.truncated and 1 not in encoding.truncated
    query_ids = reranker.tokenizer.tokenize([QUERY]).ids[0]
    assert encoding.ids[0][:len(query_ids)] == query_ids  # [CLS] query [SEP], untouched
    assert set(encoding.type_ids[0][len(query_ids):]) == {1}
    assert np.isfinite(reranker.score(QUERY, [long_document])).all()


def test_a_query_that_leaves_no_room_for_a_document_is_refused_by_name(tiny_cross_encoder):
    reranker = load(str(tiny_cross_encoder))
    with pytest.raises(ValueError, match="the query has .* tokens.*shorten the query"):
        reranker.score(" ".join(WORDS), ["a document"])


def test_what_can_and_cannot_rerank(tiny_cross_encoder, tmp_path):
    plain = build_tiny_bert(tmp_path / "plain")
    assert resolve_spec(ModelSpec(model=str(plain))).kind == "embed"
    with pytest.raises(ConfigError, match="has no sequence-classification head"):
        resolve_spec(ModelSpec(model=str(plain), kind="rerank"))
    with pytest.raises(ConfigError, match="drop the pooling choices"):
        resolve_spec(ModelSpec(model=str(tiny_cross_encoder), pooling_strategy="cls"))
    spec = resolve_spec(ModelSpec(model=str(tiny_cross_encoder)))
    assert spec.kind == "rerank" and spec.embedding_dim == 1


def test_int8_reranking_is_checked_by_rank_correlation_and_refused_below_the_bar(tiny_cross_encoder):
    import dataclasses

    from encoder_server.model.model_cache import onnx_files
    from encoder_server.model.quantization_check import check_int8

    spec = resolve_spec(ModelSpec(model=str(tiny_cross_encoder), quantize="int8", min_quant_cosine=0.1))
    fp32_file, int8_file = onnx_files(spec)
    low, mean, agreement = check_int8(spec, fp32_file, int8_file)
    assert 0.1 < low <= mean <= 1.0 and 0 < agreement <= 1.0
    with pytest.raises(ConfigError, match=r"int8 refused: .*rank correlation min .*mean .*top-3 agreement"):
        check_int8(dataclasses.replace(spec, min_quant_cosine=2.0), fp32_file, int8_file)  # above any correlation


def test_check_compares_every_served_model_with_sentence_transformers(tiny_model, tiny_cross_encoder, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import short_tmpdir

    models = tmp_path / "models.toml"
    models.write_text(f'[[models]]\nname = "e"\nmodel = "{tiny_model}"\npooling_layer = -1\n'  # as ST pools it
                      f'[[models]]\nname = "r"\nmodel = "{tiny_cross_encoder}"\n')
    checked = subprocess.run([sys.executable, "-m", "encoder_server.cli", "check", "--models", str(models)],
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "TMPDIR": str(short_tmpdir(tmp_path))})
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "e: 32 floats per embedding" in checked.stdout and "same rows" in checked.stdout
    assert "r: reranker, Sigmoid scores" in checked.stdout and "same order: same scores" in checked.stdout
