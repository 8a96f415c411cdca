"""The HTTP gateway as a real process, for tests: `encoder-server http` in front of a server's ports,
waited for until it answers, and stopped with SIGTERM, checking that it exits promptly and cleanly."""
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import httpx

from conftest import free_port

START_TIMEOUT = 30
STOP_TIMEOUT = 10
API_KEY = "sk-test-gateway"  # the key of conftest.keyed_gateway


def authorized(**headers):
    """Request options with keyed_gateway's key, and `headers`."""
    return {"headers": {"Authorization": f"Bearer {API_KEY}", **headers}}


class Gateway:
    def __init__(self, process, port, log_path):
        self.process, self.port, self.log_path = process, port, log_path
        self.url = f"http://127.0.0.1:{port}"

    @property
    def log(self):
        return self.log_path.read_text(errors="replace")

    def get(self, path, **kwargs):
        return httpx.get(self.url + path, timeout=30, **kwargs)

    def post(self, path, body, **kwargs):
        return httpx.post(self.url + path, json=body, timeout=30, **kwargs)

    def wait_status(self, path, status, timeout=60):
        """Poll GET `path` until it answers `status`; the last response."""
        deadline = time.monotonic() + timeout
        while True:
            response = self.get(path)
            if response.status_code == status:
                return response
            assert time.monotonic() < deadline, f"{path} still answers {response.status_code}: {response.text}"
            time.sleep(0.1)

    def stop(self):
        """SIGTERM; the gateway must exit with code 0 within STOP_TIMEOUT seconds."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"the gateway ignored SIGTERM for {STOP_TIMEOUT}s:\n{self.log}") from None


@contextmanager
def running_gateway(port, port_out, tmp_path, *flags):
    """`encoder-server http` in front of the server's `port` and `port_out`, with more `flags`
    (--api-key, --timeout). Yields once /health answers; stops it on exit."""
    http_port = free_port()
    command = [sys.executable, "-m", "encoder_server.cli", "http", "--connect", "127.0.0.1", "--port", str(port),
               "--port-out", str(port_out), "--http-host", "127.0.0.1", "--http-port", str(http_port), *flags]
    log_path = tmp_path / f"gateway-{http_port}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    gateway = Gateway(process, http_port, log_path)
    try:
        _wait_alive(gateway)
        yield gateway
    finally:
        if process.poll() is None:
            code = gateway.stop()
            assert code == 0, f"the gateway exited with {code} after SIGTERM:\n{gateway.log}"


def status_code(url):
    """GET `url`'s status, or None while nothing listens there yet."""
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.ConnectError:
        return None


def _wait_alive(gateway):
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None:
            raise RuntimeError(f"the gateway exited with {gateway.process.returncode}:\n{gateway.log}")
        try:
            if gateway.get("/health").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the gateway did not answer /health within {START_TIMEOUT}s:\n{gateway.log}")
