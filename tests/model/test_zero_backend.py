"""encoder_server.model.zero_backend: zero rows without a model, for benchmark/pipeline.py, and only
where the environment asks for it, so that no production server can be started on it."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
from encoder_server.model import load
embedder = load(sys.argv[1], backend="zero")
rows = embedder.embed_texts(["a text", "another, longer text"])
print(json.dumps({"shape": list(rows.shape), "nonzero": int((rows != 0).sum()), "dim": embedder.dimension}))
"""


def _run(args, zero_backend):
    env = {key: value for key, value in os.environ.items() if key != "ENCODER_SERVER_ZERO_BACKEND"}
    env.update({"HF_HUB_OFFLINE": "1", **({"ENCODER_SERVER_ZERO_BACKEND": "1"} if zero_backend else {})})
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_zero_backend_gives_zero_rows_of_the_models_width(tiny_model):
    result = _run(["-c", PROBE, str(tiny_model)], zero_backend=True)
    assert result.returncode == 0, result.stderr[-2000:]
    probe = json.loads(result.stdout.splitlines()[-1])
    assert probe["shape"] == [2, probe["dim"]] and probe["dim"] > 0 and probe["nonzero"] == 0


def test_without_the_variable_no_server_starts_on_it(tiny_model):
    result = _run(["-m", "encoder_server.cli", "start", "--model", str(tiny_model), "--backend", "zero"],
                  zero_backend=False)
    assert result.returncode != 0 and "zero" in result.stderr and "onnx" in result.stderr, result.stderr[-2000:]
    result = _run(["-c", PROBE, str(tiny_model)], zero_backend=False)
    assert result.returncode != 0 and "zero" in result.stderr
