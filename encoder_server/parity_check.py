"""`encoder-server check`: a built-in sample through a real server started with the given choices,
and through sentence-transformers itself, for each served model; prints the row cosines and the
width, exits non-zero below MIN_COSINE (or when sentence-transformers is missing, since nothing was
compared). A reranker's scores for a few queries over the sample are compared with
CrossEncoder.predict's, and a sparse model's rows with SparseEncoder.encode's (the same non-zero
entries, values within MAX_SPARSE_DIFFERENCE of the largest).

With --quantize int8 the served rows are int8's and the reference stays sentence-transformers'
fp32: it prints the figures that say what int8 costs (min and mean row cosine, and how many of
each text's 10 nearest neighbours stay the same) and exits non-zero when the mean cosine is below
--min-quant-cosine, the bar the server itself applies at start-up."""
import subprocess
import sys

import numpy as np

from encoder_client import EncoderClient

from .model.quantization_check import neighbour_overlap, rank_correlation, row_cosine
from .model.sample import SAMPLE as INT8_SAMPLE
from .model.spec import BERT_AS_SERVICE_DEFAULTS, PLAIN_FOLDER_POOLING
from .ports import free_port
from .quickstart import wait_until_ready
from .settings import resolve

MIN_COSINE = 0.9999
MAX_SCORE_DIFFERENCE = 1e-4
MAX_SPARSE_DIFFERENCE = 1e-4  # relative to the largest value
NO_REFERENCE = "sentence-transformers is not installed, so nothing was compared: pip install sentence-transformers"
QUERIES = ["How do I reset my password?", "Where does the cat sleep?", "What is the capital of Japan?"]
SAMPLE = ["A man is eating food.", "The girl is carrying a baby.", "How do I reset my password?",
          "Die Katze schläft auf dem Sofa.", "東京は日本の首都です。", "🙂 emoji, punctuation — and “quotes”",
          "word " * 600, "x", *(f"Sentence {i} is about topic {i % 5}, in a little more detail than the others."
                                for i in range(24))]


def check(start_flags, choices):
    """0 when every served model's rows match sentence-transformers' within MIN_COSINE (a reranker's
    scores CrossEncoder.predict's within MAX_SCORE_DIFFERENCE; int8: at least --min-quant-cosine),
    else 1."""
    settings = resolve(**choices)
    _build_onnx_files(settings)
    port, port_out = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "encoder_server.cli", "start", *start_flags, "--port", str(port),
                               "--port-out", str(port_out), "--num-worker", "1"])
    try:
        wait_until_ready(server, port=port, port_out=port_out)
        with EncoderClient(port=port, port_out=port_out, timeout=300) as client:
            served = [(model, _served(client, model)) for model in settings.all_models]
    finally:
        server.terminate()
        server.wait(60)
    checks = {"rerank": _check_reranker, "sparse": _check_sparse, "embed": _check_embedder}
    return max(checks[model.kind](model, rows) for model, rows in served)


def _build_onnx_files(settings):
    """Build the ONNX files that the server will serve (or find them cached) here, in a process that
    loads torch for the reference anyway: the server then finds them cached, where it would export
    in a child of its own that loads torch and transformers once more (10 CPU seconds on 2 cores)."""
    from .logs import configure_logging
    from .model.model_cache import onnx_files

    configure_logging("check", settings.verbose)
    for model in settings.all_models:
        if model.backend == "onnx":
            onnx_files(model)


def _served(client, model):
    if model.kind == "rerank":
        return [[score for _, score in sorted(client.rerank(query, SAMPLE, model=model.name))] for query in QUERIES]
    return client.encode(SAMPLE + INT8_SAMPLE if model.quantize else SAMPLE, model=model.name)


def _check_embedder(settings, served):
    sample = SAMPLE + INT8_SAMPLE if settings.quantize else SAMPLE  # more neighbours to compare
    print(f"{settings.name}: {served.shape[1]} floats per embedding ({settings.pooling.describe()}"
          f"{''.join(' + ' + layer.describe() for layer in settings.head)})")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print(NO_REFERENCE)
        return 1
    reference = SentenceTransformer(settings.model, device="cpu").encode(sample)
    if reference.shape != served.shape:
        print(f"sentence-transformers gives {reference.shape[1]} floats per embedding; the server {served.shape[1]}")
        return 1
    cosine = row_cosine(served, reference)
    if settings.quantize:
        return _report_int8(cosine, neighbour_overlap(reference, served), settings.min_quant_cosine)
    verdict = "same rows" if cosine.min() >= MIN_COSINE else f"DIFFERENT (below {MIN_COSINE})"
    print(f"row cosine against sentence-transformers over {len(sample)} texts: min {cosine.min():.7f}, "
          f"mean {cosine.mean():.7f}: {verdict}")
    if cosine.min() >= MIN_COSINE:
        return 0
    if settings.pooling_source == BERT_AS_SERVICE_DEFAULTS and settings.pooling != PLAIN_FOLDER_POOLING:
        # the rows differ by a choice, not an error: say which, and how to match sentence-transformers
        print(f"  {settings.model} has no sentence-transformers config: the server pools "
              f"{settings.pooling.describe()} (bert-as-service's defaults, unless chosen), where sentence-transformers "
              f"pools {PLAIN_FOLDER_POOLING.describe()}; start with --pooling-layer -1 "
              "--pooling-strategy mean to serve what sentence-transformers computes")
    return 1


def _check_reranker(settings, served):
    """The served scores of every (query, sample text) pair against CrossEncoder.predict's."""
    print(f"{settings.name}: reranker, {settings.score_activation.rsplit('.', 1)[-1]} scores")
    try:
        from sentence_transformers import CrossEncoder
    except ImportError:
        print(NO_REFERENCE)
        return 1
    model = CrossEncoder(settings.model, device="cpu")
    reference = [model.predict([(query, text) for text in SAMPLE]) for query in QUERIES]
    if settings.quantize:
        correlation = np.array([rank_correlation(a, b) for a, b in zip(reference, served)])
        good = correlation.mean() >= settings.min_quant_cosine
        print(f"int8 against sentence-transformers fp32 over {len(QUERIES)} queries x {len(SAMPLE)} texts: rank "
              f"correlation min {correlation.min():.5f}, mean {correlation.mean():.5f}: "
              f"{'within' if good else 'BELOW'} --min-quant-cosine {settings.min_quant_cosine} (mean)")
        return 0 if good else 1
    difference = float(np.abs(np.array(served) - np.array(reference)).max())
    same_order = all(list(np.argsort(-np.array(a), kind="stable")) == list(np.argsort(-b, kind="stable"))
                     for a, b in zip(served, reference))
    good = difference <= MAX_SCORE_DIFFERENCE and same_order
    print(f"scores against CrossEncoder.predict over {len(QUERIES)} queries x {len(SAMPLE)} texts: largest "
          f"difference {difference:.2e}, {'same' if same_order else 'DIFFERENT'} order: "
          f"{'same scores' if good else 'DIFFERENT'}")
    return 0 if good else 1


def _check_sparse(settings, served):
    """The served sparse rows against SparseEncoder.encode's: the same entries, the same values."""
    print(f"{settings.name}: sparse, {settings.embedding_dim} vocabulary entries a row "
          f"({settings.splade_pooling} pooling)")
    try:
        from sentence_transformers import SparseEncoder
    except ImportError:
        print(NO_REFERENCE)
        return 1
    reference = SparseEncoder(settings.model, device="cpu").encode(SAMPLE, convert_to_tensor=True)
    reference, served = reference.to_dense().numpy(), served.to_dense()
    same_entries = bool(np.array_equal(reference != 0, served != 0))
    difference = float(np.abs(served - reference).max() / max(np.abs(reference).max(), 1e-12))
    good = same_entries and difference <= MAX_SPARSE_DIFFERENCE
    print(f"against SparseEncoder.encode over {len(SAMPLE)} texts: {'same' if same_entries else 'DIFFERENT'} non-zero "
          f"entries, largest difference {difference:.2e} of the largest value: {'same rows' if good else 'DIFFERENT'}")
    return 0 if good else 1


def _report_int8(cosine, overlap, bar):
    good = cosine.mean() >= bar
    print(f"int8 against sentence-transformers fp32 over {len(cosine)} texts: min row cosine {cosine.min():.5f}, "
          f"mean {cosine.mean():.5f}, top-10 neighbour overlap {overlap:.3f}: "
          f"{'within' if good else 'BELOW'} --min-quant-cosine {bar} (mean)")
    return 0 if good else 1
