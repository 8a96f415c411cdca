"""`encoder-server check`: a built-in sample through a real server started with the given choices,
and through sentence-transformers itself; prints the row cosines and the width, exits non-zero
below MIN_COSINE (or when sentence-transformers is missing, since nothing was compared).

With --quantize int8 the served rows are int8's and the reference stays sentence-transformers'
fp32: it prints the figures that say what int8 costs (min and mean row cosine, and how many of
each text's 10 nearest neighbours stay the same) and exits non-zero when the mean cosine is below
--min-quant-cosine, the bar the server itself applies at start-up."""
import subprocess
import sys

from encoder_client import EncoderClient

from .model.quantization_check import SAMPLE as INT8_SAMPLE
from .model.quantization_check import neighbour_overlap, row_cosine
from .ports import free_port
from .quickstart import wait_until_ready
from .settings import resolve

MIN_COSINE = 0.9999
SAMPLE = ["A man is eating food.", "The girl is carrying a baby.", "How do I reset my password?",
          "Die Katze schläft auf dem Sofa.", "東京は日本の首都です。", "🙂 emoji, punctuation — and “quotes”",
          "word " * 600, "x", *(f"Sentence {i} is about topic {i % 5}, in a little more detail than the others."
                                for i in range(24))]


def check(start_flags, choices):
    """0 when the served rows match sentence-transformers' within MIN_COSINE (int8: a mean cosine of
    at least --min-quant-cosine), else 1."""
    settings = resolve(**choices)
    sample = SAMPLE + INT8_SAMPLE if settings.quantize else SAMPLE  # more neighbours to compare
    port, port_out = free_port(), free_port()
    server = subprocess.Popen([sys.executable, "-m", "encoder_server.cli", "start", *start_flags, "--port", str(port),
                               "--port-out", str(port_out), "--num-worker", "1"])
    try:
        wait_until_ready(server, port=port, port_out=port_out)
        with EncoderClient(port=port, port_out=port_out, timeout=300) as client:
            served = client.encode(sample)
    finally:
        server.terminate()
        server.wait(60)
    print(f"{settings.model_name[0]}: {served.shape[1]} floats per embedding ({settings.pooling.describe()}"
          f"{''.join(' + ' + layer.describe() for layer in settings.head)})")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        print("sentence-transformers is not installed, so nothing was compared: pip install sentence-transformers")
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
    return 0 if cosine.min() >= MIN_COSINE else 1


def _report_int8(cosine, overlap, bar):
    good = cosine.mean() >= bar
    print(f"int8 against sentence-transformers fp32 over {len(cosine)} texts: min row cosine {cosine.min():.5f}, "
          f"mean {cosine.mean():.5f}, top-10 neighbour overlap {overlap:.3f}: "
          f"{'within' if good else 'BELOW'} --min-quant-cosine {bar} (mean)")
    return 0 if good else 1
