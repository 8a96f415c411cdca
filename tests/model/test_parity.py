"""The bundled all-MiniLM-L6-v2 through the service against sentence-transformers itself."""
import numpy as np
import pytest

from conftest import running_server

pytestmark = pytest.mark.timeout(600)


def test_bundled_model_matches_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer
    from encoder_server.model.model_folder import default_model_path

    texts = ["A man is eating food.", "The weather is lovely today.", "Ünïcödé and emoji ✓ テキスト",
             "word " * 600,  # far beyond max_seq_len 256: truncated exactly as sentence-transformers does
             *(f"Sentence number {i} talks about topic {i % 7} in some detail." for i in range(40))]
    model = default_model_path()
    with running_server(model, tmp_path=tmp_path) as server:
        with server.client() as client:
            served = client.encode(texts)
            assert client.server_config["max_seq_len"] == 256
    reference = SentenceTransformer(str(model), device="cpu").encode(texts)
    cosine = (served * reference).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(reference, axis=1)
    print(f"row cosine vs sentence-transformers: min {cosine.min():.8f}, "
          f"max abs diff {np.abs(served - reference).max():.2e}")
    assert cosine.min() >= 0.9999
