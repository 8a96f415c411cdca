"""The start-up accuracy check for int8: quantized against fp32 on a built-in sample of texts; for a
reranker, on the sample's questions as queries with every sample text as a document."""
import logging
from dataclasses import replace

import numpy as np

from .embedder import Embedder
from .model_folder import ConfigError
from .sample import SAMPLE

log = logging.getLogger(__name__)


def check_int8(spec, fp32_file, int8_file):
    """Log the min and mean row cosine and the top-10 neighbour overlap; raise ConfigError if the
    mean cosine is below --min-quant-cosine. Returns (min cosine, mean cosine, neighbour overlap).
    A reranker's check is check_int8_rerank."""
    if spec.kind == "rerank":
        return check_int8_rerank(spec, fp32_file, int8_file)
    reference, quantized = (Embedder(replace(spec, onnx_file=str(path))).embed_texts(SAMPLE)
                            for path in (fp32_file, int8_file))
    cosine = row_cosine(reference, quantized)
    overlap = neighbour_overlap(reference, quantized)
    summary = (f"int8 vs fp32 on {len(SAMPLE)} sample texts: min row cosine {cosine.min():.5f}, "
               f"mean {cosine.mean():.5f}, top-10 neighbour overlap {overlap:.3f}")
    log.info(summary)
    if cosine.mean() < spec.min_quant_cosine:
        raise ConfigError(f"--quantize int8 refused: {summary}, below --min-quant-cosine "
                          f"{spec.min_quant_cosine}; serve fp32 or lower the bar knowingly")
    return float(cosine.min()), float(cosine.mean()), overlap


def row_cosine(a, b):
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, 1e-12)


def neighbour_overlap(reference, candidate, k=10):
    """For each row, the share of its k nearest other rows by cosine (k at most len - 1) that both
    embeddings agree on, averaged over the rows; 1.0 when there are fewer than two rows."""
    k = min(k, len(reference) - 1)
    if k < 1:
        return 1.0
    neighbours = []
    for rows in (reference, candidate):
        rows = rows.reshape(len(rows), -1).astype(np.float64)
        rows = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        similarity = rows @ rows.T
        np.fill_diagonal(similarity, -np.inf)
        neighbours.append(np.argpartition(-similarity, k - 1, axis=1)[:, :k])
    shared = [len(np.intersect1d(a, b)) for a, b in zip(*neighbours)]
    return float(np.mean(shared) / k)


def check_int8_rerank(spec, fp32_file, int8_file, k=3):
    """For each question of SAMPLE as a query over every SAMPLE text: the rank correlation (Spearman)
    of int8's scores with fp32's, and how many of fp32's top `k` int8 keeps; log the min and mean of
    the first and the mean of the second, and raise ConfigError if the mean correlation is below
    --min-quant-cosine. Returns (min correlation, mean correlation, top-k agreement)."""
    from .reranker import Reranker

    queries = [text for text in SAMPLE if text.endswith("?")]
    reference, quantized = ([Reranker(replace(spec, onnx_file=str(path))).score(query, SAMPLE) for query in queries]
                            for path in (fp32_file, int8_file))
    correlation = np.array([rank_correlation(a, b) for a, b in zip(reference, quantized)])
    agreement = float(np.mean([len(set(np.argsort(-a)[:k]) & set(np.argsort(-b)[:k])) / k
                               for a, b in zip(reference, quantized)]))
    summary = (f"int8 vs fp32 reranking {len(SAMPLE)} sample texts for {len(queries)} queries: rank correlation min "
               f"{correlation.min():.5f}, mean {correlation.mean():.5f}, top-{k} agreement {agreement:.3f}")
    log.info(summary)
    if correlation.mean() < spec.min_quant_cosine:
        raise ConfigError(f"--quantize int8 refused: {summary}, below --min-quant-cosine {spec.min_quant_cosine} "
                          "(a reranker's bar on the mean rank correlation); serve fp32 or lower the bar knowingly")
    return float(correlation.min()), float(correlation.mean()), agreement


def rank_correlation(a, b):
    """Spearman's rank correlation of two score vectors (ties broken by position)."""
    ranks = [np.argsort(np.argsort(values, kind="stable"), kind="stable").astype(np.float64) for values in (a, b)]
    return float(np.corrcoef(*ranks)[0, 1])
