"""Free ports: a process that keeps to a slice of the range hands the slice on to the processes it starts."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_slice_holds_in_the_processes_started_after_it():
    # a parent keeps to slice 1 of 4, then starts a child (as a test starts a benchmark), which picks a port
    code = ("import subprocess, sys\n"
            "from encoder_server import ports\n"
            "ports.use_slice(1, 4)\n"
            "print(*ports._range)\n"
            "child = 'from encoder_server.ports import free_port; print(*(free_port() for _ in range(50)))'\n"
            "subprocess.run([sys.executable, '-c', child], check=True)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            check=True)
    bounds, picked = result.stdout.splitlines()
    first, end = map(int, bounds.split())
    assert end - first > 1000
    assert all(first <= int(port) < end for port in picked.split()), (bounds, picked)


def test_a_malformed_inherited_slice_is_named():
    for value in ("abc", "2/2", "1/0", "-1/4", "1/4/2"):
        result = subprocess.run([sys.executable, "-c", "import encoder_server.ports"], cwd=ROOT, capture_output=True,
                                text=True, timeout=60, env={**os.environ, "ENCODER_SERVER_PORT_SLICE": value})
        assert result.returncode != 0 and "ENCODER_SERVER_PORT_SLICE must be INDEX/COUNT" in result.stderr, value
