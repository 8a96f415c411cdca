"""Start a server on the bundled model, encode a few sentences, stop it: `python -m encoder_server.quickstart`."""
import subprocess
import sys
import time

import numpy as np

from encoder_client import EncoderClient

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A cheetah is running behind its prey."]


def wait_until_ready(server, timeout=180, **address):
    deadline, seen = time.monotonic() + timeout, "no answer"
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server exited with code {server.returncode}")
        try:
            with EncoderClient(timeout=2, **address) as client:
                status = client.server_status
        except TimeoutError:
            seen = "no answer"
        else:
            if status["ready"]:
                return
            seen = f"{status['workers_alive']} of {status['workers_expected']} workers ready"
        time.sleep(0.5)
    sys.exit(f"the server did not become ready within {timeout:g} s (the last check: {seen})")


def main():
    server = subprocess.Popen([sys.executable, "-m", "encoder_server.cli", "start"])
    try:
        wait_until_ready(server)
        with EncoderClient(timeout=60) as client:
            vectors = client.encode(SENTENCES)
        print(f"\nencode({len(SENTENCES)} sentences) -> {vectors.dtype} array of shape {vectors.shape}")
        similarity = vectors @ vectors.T
        for i, sentence in enumerate(SENTENCES):
            nearest = int(np.argsort(-similarity[i])[1])
            print(f"  {sentence!r:45} nearest: {SENTENCES[nearest]!r} (cosine {similarity[i, nearest]:.3f})")
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
