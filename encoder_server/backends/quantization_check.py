"""The start-up accuracy check for int8: quantized against fp32 on a built-in sample of texts."""
import logging

import numpy as np

from ..batching import BatchPlanner, drain
from ..model_folder import ConfigError
from ..scheduling import Job
from ..tokenizer import TextTokenizer
from .onnx_backend import OnnxEncoder

log = logging.getLogger(__name__)
SAMPLE = [
    "Hello world.",
    "The cat sat on the mat.",
    "How do I reset my password?",
    "Stock markets fell sharply on Monday after the central bank raised interest rates.",
    "A quick brown fox jumps over the lazy dog near the river bank at sunset.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "I absolutely loved this movie; the acting was superb and the plot kept me guessing.",
    "Terrible service, cold food, and we waited an hour for a table.",
    "The function returns None when the key is missing from the dictionary.",
    "Quantum computers use qubits, which can represent zero and one at the same time.",
    "Please remember to bring your passport and two printed copies of the booking.",
    "She plays the violin in the city orchestra every Saturday evening.",
    "What is the capital of Australia?",
    "Canberra is the capital city of Australia, not Sydney as many people think.",
    "Error 404: the page you are looking for could not be found on this server.",
    "Mix the flour, sugar and butter, then bake for twenty minutes at 180 degrees.",
    "The committee will review all applications and announce the results next month.",
    "Machine learning models can inherit biases present in their training data.",
    "ok",
    "Why is the sky blue during the day but red at sunset?",
    " ".join(["The history of the region is long and complicated, shaped by trade, migration, war and "
              "the slow growth of cities along the great rivers that cross its plains."] * 4),
    " ".join(["Customer reviews mention long battery life, a bright screen and a keyboard that feels "
              "solid, though several people found the speakers weak and the charger slow."] * 3),
]


def check_int8(settings, fp32_file, int8_file):
    """Log the min and mean row cosine; raise ConfigError if the mean is below --min-quant-cosine."""
    tokenizer = TextTokenizer(settings.model, settings.truncate_at)
    reference, quantized = (_embed(settings, tokenizer, path) for path in (fp32_file, int8_file))
    cosine = row_cosine(reference, quantized)
    summary = f"int8 vs fp32 on {len(SAMPLE)} sample texts: min row cosine {cosine.min():.5f}, mean {cosine.mean():.5f}"
    log.info(summary)
    if cosine.mean() < settings.min_quant_cosine:
        raise ConfigError(f"--quantize int8 refused: {summary}, below --min-quant-cosine "
                          f"{settings.min_quant_cosine}; serve fp32 or lower the bar knowingly")
    return float(cosine.min()), float(cosine.mean())


def row_cosine(a, b):
    a, b = a.reshape(len(a), -1).astype(np.float64), b.reshape(len(b), -1).astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, 1e-12)


def _embed(settings, tokenizer, model_file):
    encoder = OnnxEncoder(settings, model_file)
    planner = BatchPlanner(max_batch_tokens=4096, max_batch_size=len(SAMPLE), pad_id=tokenizer.pad_id)
    job = tokenizer.tokenize(Job(job_id=0, seq=0, offset=0, texts=SAMPLE))
    planner.add(job)
    drain(planner, encoder.embed)
    return job.result()
