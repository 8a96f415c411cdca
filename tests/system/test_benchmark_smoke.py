"""The benchmark machinery end to end at toy sizes: it must produce its JSON, plots and table."""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_smoke_run_writes_json_plots_and_table(tiny_model, tmp_path):
    # the peers scenario with the one peer this venv has: sentence-transformers, in an interpreter of its own
    result = subprocess.run([sys.executable, "-m", "benchmark.run", "--smoke", "--model", str(tiny_model),
                             "--out", str(tmp_path), "--peer-engines", "st"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    engines = {row["engine"] for row in results["client_batches"]}
    assert {"service (onnx fp32, defaults)", "onnx backend in-process"} <= engines
    assert all(row["sentences_per_s"] > 0 for row in results["client_batches"] + results["concurrency"])
    assert results["fairness"]["idle"]["requests"] > 0 and results["tiny_clients"]["ratio"] > 0
    latency = results["latency"]
    assert {"onnx backend in-process, 1 thread(s)", "service (onnx fp32, defaults)"} <= \
        {row["engine"] for row in latency["rows"]}
    assert all(row["requests"] > 0 and row["p50_ms"] > 0 for row in latency["rows"])
    memory = results["memory"]
    assert [row["server"] for row in memory["rows"]] == ["1 lane(s)", "2 lane(s)", "3 lane(s)", "defaults"]
    assert all(0 < row["peak_pss_mb"] <= row["peak_rss_mb"] for row in memory["rows"])
    graphs = {row["variant"]: row for row in results["graphs"]}
    assert graphs["fp32 (served)"]["min_cosine"] > 0.99999 and len(graphs) >= 5
    for plot in ("concurrency.png", "client_batches.png"):
        assert (tmp_path / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "RESULTS.md").read_text()
    assert "## Targets" in table and "## Concurrent closed-loop clients" in table and "## ONNX graphs" in table
    assert "## One text per request" in table and "## Memory of the whole server" in table
    assert not list(tmp_path.glob("bench-*.log"))
    peers = results["peers"]
    assert {row["engine"] for row in peers["summary"]} == {"service (onnx fp32, defaults)",
                                                          "sentence-transformers, torch (in-process)"}
    assert all(row["sentences_per_s"] > 0 for row in peers["rows"]) and len(peers["rows"]) == 2 * 6
    assert set(results["ceiling"]["fp32_gflops"]) and "## Against in-process peers" in table
    pipeline = {(row["engine"], row["cell"]): row for row in results["pipeline"]}
    assert set(pipeline) == {(engine, cell) for engine in ("service", "bare chain")
                             for cell in ("32 clients x 32 short texts", "32 clients x 1 short text")}
    assert all(row["requests_per_s"] > 0 and row["cpu_us_per_request"]["ventilator"] > 0
               and row["cpu_us_per_request"]["sink"] > 0 for row in pipeline.values())
    assert all(len(row["of_chain"]) == 1 and row["of_chain"][0] > 0 for (engine, _), row in pipeline.items()
               if engine == "service")
    assert "## The server's own ceiling" in table and "| bare chain |" in table and "## GPU" in table


def test_gpu_sweep_machinery_on_the_cpu(tiny_model, tmp_path, monkeypatch):
    """benchmark/gpu_sweep.py, as DEVICE=cpu runs it (fp32 only): a row per configuration and load, and
    sentence-transformers on the one-client loads; and the flags of the servers it would start on cuda."""
    out = tmp_path / "sweep.json"
    result = subprocess.run([sys.executable, "-m", "benchmark.gpu_sweep", str(tiny_model), "--workers", "2",
                             "--wide-rows", "128", "--seconds", "0.5", "--texts", "300", "100", "--out", str(out),
                             "--log-dir", str(tmp_path)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "DEVICE": "cpu"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = json.loads(out.read_text())
    assert sweep["device"].startswith("cpu") and sweep["default_workers"] is None
    loads = ["short, 32 clients x 32", "short, 1 client x 300 in 256s", "medium, 1 client x 100 in 256s",
             "short, 1 client x 200 one at a time"]
    assert [(row["configuration"], row["cell"]) for row in sweep["rows"]] == [
        ("sentence-transformers, fp32", "short, 1 client x 300 in 256s"),
        ("sentence-transformers, fp32", "medium, 1 client x 100 in 256s"),
        *(("2 workers, fp32", load) for load in loads), *(("2 workers, fp32, 128 rows a pass", load) for load in loads)]
    assert all(row["texts_per_s"] > 0 and row["p50_ms"] > 0 for row in sweep["rows"])
    services = [row for row in sweep["rows"] if not row["configuration"].startswith("sentence-transformers")]
    assert all(row["busy_cores"]["workers"] > 0 and {"ventilator", "sink"} <= row["busy_cores"].keys()
               for row in services)  # the ventilator's and sink's may round to 0 in cells this short
    assert all("busy_cores" not in row for row in sweep["rows"] if row not in services)  # in process: not measured
    from benchmark import gpu_sweep  # the servers' flags: the wide configuration is the most workers, rows capped
    monkeypatch.setattr(gpu_sweep, "DEVICE", "cuda")
    services = [make() for _, make, in_process in gpu_sweep.engines_to_run(tiny_model, [1, 2], tmp_path, 128)
                if not in_process]
    assert [service.command[service.command.index("--device"):] for service in services] == [
        ["--device", "cuda", "--num-worker", "1"], ["--device", "cuda", "--num-worker", "1", "--fp16"],
        ["--device", "cuda", "--num-worker", "2"], ["--device", "cuda", "--num-worker", "2", "--fp16"],
        ["--device", "cuda", "--num-worker", "2", "--max-batch-size", "128"],
        ["--device", "cuda", "--num-worker", "2", "--fp16", "--max-batch-size", "128"]]
    assert gpu_sweep.parse_service("8:fp16:eager") == (
        "8 workers, fp16, no CUDA graphs", ("--device", "cuda", "--num-worker", "8", "--fp16", "--no-cuda-graphs"))
    assert gpu_sweep.parse_service("2:fp32:tok6:lanes2") == (
        "2 workers, fp32, 2 lanes, 6 tokenizing",
        ("--device", "cuda", "--num-worker", "2", "--lanes", "2", "--tokenizer-threads", "6"))
    assert gpu_sweep.parse_service("8:fp16:pinned") == (
        "8 workers, fp16, pinned", ("--device", "cuda", "--num-worker", "8", "--fp16", "--pin-cpus"))
    assert gpu_sweep.parse_service("8:fp16:prefetch2") == (
        "8 workers, fp16, 2 jobs held a lane",
        ("--device", "cuda", "--num-worker", "8", "--fp16", "--prefetch-size", "2"))
    with pytest.raises(argparse.ArgumentTypeError, match="expected WORKERS"):
        gpu_sweep.parse_service("2:fp16:tok")
    from benchmark.report import _gpu_table  # the `gpu` scenario's table in RESULTS.md, from the same rows
    table = "\n".join(_gpu_table(sweep))
    assert "| 2 workers, fp32 | short, 32 clients x 32 |" in table and "| sentence-transformers, fp32 |" in table
    assert "| cores busy: workers / ventilator / sink |" in table


def test_gpu_busy_is_the_mean_of_nvidia_smi_s_readings_over_the_block(tmp_path, monkeypatch):
    """GpuBusy reads nvidia-smi's utilization.gpu as a program of that name prints it (one number a
    line, every 100 ms, until stopped), and puts it in the GPU table beside the cores busy."""
    from benchmark import gpu_sweep
    from benchmark.report import _gpu_table
    program = tmp_path / "nvidia-smi"
    program.write_text("#!/bin/sh\nfor value in 40 60 80; do echo $value; sleep 0.05; done\nexec sleep 30\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpu_sweep, "DEVICE", "cuda")
    started = time.monotonic()
    with gpu_sweep.GpuBusy() as gpu:
        time.sleep(0.5)
    assert gpu.percent == 60.0 and time.monotonic() - started < 10  # stopped, not waited for
    assert gpu_sweep.mean_reading("[N/A]\n") is None
    monkeypatch.setattr(gpu_sweep, "DEVICE", "cpu")
    with gpu_sweep.GpuBusy() as gpu:
        pass
    assert gpu.percent is None
    row = {"configuration": "8 workers, fp16", "cell": "short", "texts_per_s": 1.0, "p50_ms": 1, "p99_ms": 2}
    table = _gpu_table({"device": "H200", "default_workers": 8, "rows": [{**row, "gpu_busy_percent": 71.5}, row]})
    assert table[4].endswith(" GPU busy % |") and table[6].endswith("| 71.5 |") and table[7].endswith("| – |")


def test_interleaved_times_each_text_in_process_and_through_the_service(tiny_model, tmp_path):
    logs = [Path("/tmp"), tmp_path]  # where the server's log would stay: the old fixed folder, or TMPDIR
    before = [set(folder.glob("bench-*.log")) for folder in logs]
    result = subprocess.run([sys.executable, "-m", "benchmark.interleaved", "--kind", "short", "--texts", "6",
                             "--model", str(tiny_model)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [set(folder.glob("bench-*.log")) for folder in logs] == before  # removed once the server stopped
    report = json.loads(result.stdout)
    for engine in ("in-process", "service"):
        row = report[engine]
        assert row["requests"] == 6 and 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"], report
    assert set(report["service - in-process"]) == {"p50_ms", "p95_ms"}


def test_engines_take_turns_run_by_run_and_each_gets_the_median_of_its_own_runs():
    from benchmark.load import taking_turns
    order = []

    def run(engine):  # a host that speeds up run by run
        order.append(engine)
        return {"sentences_per_s": len(order)}

    medians = taking_turns(["in-process", "service"], run, repeats=4)
    # each round in the other order: the drift favours neither (always in-process first: 4 against 5)
    assert order == ["in-process", "service", "service", "in-process"] * 2
    assert medians == [{"sentences_per_s": 4.5}, {"sentences_per_s": 4.5}]
    order.clear()
    assert taking_turns(["a", "b", "c"], run, repeats=4) == [{"sentences_per_s": 6.5}] * 3
    assert order == ["a", "b", "c", "c", "b", "a"] * 2


def test_cpu_split_groups_perf_rows_by_process_and_by_what_ran():
    from benchmark.cpu_split import split, table
    report = """# Samples: 4K of event 'cpu-clock:ppp'
# Overhead  Command     Shared Object
# ........  ..........  ........................
    15.30%  ventilator  libpython3.11.so.1.0
    13.84%  ZMQbg/IO/0  [kernel.kallsyms]
    13.15%  python      libpython3.11.so.1.0
     9.49%  python      [kernel.kallsyms]
     6.99%  worker-0    libpython3.11.so.1.0
     6.20%  worker-1    libpython3.11.so.1.0
     4.66%  swapper     [kernel.kallsyms]
     2.19%  ZMQbg/IO/0  libzmq-2f02442c.so.5.2.5
     1.33%  worker-1    _multiarray_umath.cpython-311-x86_64-linux-gnu.so
     0.69%  sink        libc.so.6
     0.46%  ventilator  _zmq.cpython-311-x86_64-linux-gnu.so
     0.08%  kdamond.0   [kernel.kallsyms]
"""
    shares = split(report)
    assert shares["ventilator"] == {"Python": 15.3, "kernel": 0.0, "ZeroMQ": 0.46, "other native": 0.0}
    assert shares["workers"] == {"Python": 13.19, "kernel": 0.0, "ZeroMQ": 0.0, "other native": 1.33}
    assert shares["clients"]["Python"] == 13.15 and shares["clients"]["kernel"] == 9.49
    assert shares["ZeroMQ I/O threads"] == {"Python": 0.0, "kernel": 13.84, "ZeroMQ": 2.19, "other native": 0.0}
    assert shares["sink"]["other native"] == 0.69 and shares["idle"]["kernel"] == 4.66
    assert shares["other"]["kernel"] == 0.08
    lines = table(shares)
    assert "| workers | 13.2 | 0.0 | 0.0 | 1.3 | 14.5 |" in lines
    assert lines[-1] == "| all but idle | 41.6 | 23.4 | 2.6 | 2.0 | 69.7 |"  # idle (swapper) left out


def test_cpu_split_by_thread_reads_each_stage_s_own_and_zeromq_s_threads():
    """A thread's CPU time counts in clock ticks of 10 ms: a window of 2 s leaves each stage some
    even on a loaded CI host (one of 0.5 s read none for any stage there once)."""
    from benchmark.cpu_split import measure_threads
    cell, threads = measure_threads(batch=1, clients=2, seconds=2.0, loaders=1, flags=("--num-worker", "1"))
    assert cell["requests_per_s"] > 0
    for stage in ("ventilator", "sink", "workers"):
        assert threads[f"{stage}, own"]["user_us"] > 0 and f"{stage}, ZeroMQ" in threads, (cell, threads)


def test_a_py_spy_profile_gives_each_line_s_and_each_function_s_share_of_the_samples():
    from benchmark.cpu_split import profile
    loop = "<module> (encoder_server/cli.py:9);Sink.run (encoder_server/server/sink.py:{})"
    raw = "\n".join([f"{loop.format(81)};Poller.poll (zmq/sugar/poll.py:106) 6",
                     f"{loop.format(90)};Sink.release (encoder_server/server/sink.py:271) 3",
                     f"{loop.format(91)};Sink.release (encoder_server/server/sink.py:275) 1", ""])
    assert profile(raw, samples_per_core=20) == {
        "gil_cores": 0.5,
        "own": {"Poller.poll (zmq/sugar/poll.py:106)": 60.0, "Sink.release (encoder_server/server/sink.py:271)": 30.0,
                "Sink.release (encoder_server/server/sink.py:275)": 10.0},
        "within": {"Sink.run (encoder_server/server/sink.py)": 100.0,  # the launcher's frames left out
                   "Sink.release (encoder_server/server/sink.py)": 40.0}}
    assert list(profile(raw, 20, top=1)["own"]) == ["Poller.poll (zmq/sugar/poll.py:106)"]


def test_threads_group_as_their_process_s_own_zeromq_s_or_by_their_own_name():
    from benchmark.cpu_split import _thread_group
    assert _thread_group("worker-0", "worker-0") == _thread_group("", "sink") == "own"
    assert _thread_group("ZMQbg/IO/0", "worker-0") == _thread_group("ZMQbg/Reaper", "sink") == "ZeroMQ"
    assert _thread_group("cuda00001400006", "worker-3") == "cuda"
    assert _thread_group("cuda-EvtHandlr", "worker-3") == "cuda-EvtHandlr"


def test_py_spy_samples_each_stage_of_a_server_under_load():
    from benchmark.cpu_split import measure_py_spy
    cell, stages = measure_py_spy(batch=4, clients=2, seconds=2.0, loaders=1, flags=("--num-worker", "1"), rate=100)
    assert cell["requests_per_s"] > 0
    assert "Ventilator.run (encoder_server/server/ventilator.py)" in stages["ventilator"]["within"], stages
    assert stages["workers"]["gil_us_per_request"] > 0, stages
    for stage in ("ventilator", "sink", "workers"):
        assert stages[stage]["cpu_us_per_request_by_thread"]["own"] > 0, stages
    assert "Sink.run (encoder_server/server/sink.py)" in stages["sink"]["within"], stages
    assert any("Worker." in function for function in stages["workers"]["within"]), stages


def test_a_process_py_spy_cannot_sample_keeps_its_threads_cpu_and_says_why(tmp_path, monkeypatch):
    from benchmark import cpu_split
    refusing = tmp_path / "py-spy"
    refusing.write_text("#!/bin/sh\necho 'Permission denied (os error 13)' >&2\nexit 1\n")
    refusing.chmod(0o755)
    monkeypatch.setattr(cpu_split, "py_spy", lambda: str(refusing))
    cell, stages = cpu_split.measure_py_spy(batch=1, clients=1, seconds=1.0, loaders=1, flags=("--num-worker", "1"))
    assert cell["requests_per_s"] > 0
    for stage in ("ventilator", "sink", "workers"):
        assert "Permission denied" in stages[stage]["py_spy_error"] and "own" in stages[stage][
            "cpu_us_per_request_by_thread"] and "gil_cores" not in stages[stage], stages


def test_a_closed_loop_calls_its_watcher_with_the_window_while_the_clients_run():
    from benchmark import engines, pipeline
    seen = []

    def watch(window):
        seen.append((window, time.time()))

    with engines.Service("zero", ("--backend", "zero", "--num-worker", "1"), env=pipeline.ZERO_BACKEND) as server:
        cell = pipeline.closed_loop(server.port, server.port_out, 2, 1, 0.5, 1, server.process.pid, warmup=0.2,
                                    during=watch)
    assert cell["requests_per_s"] > 0
    [((begin, end), called)] = seen
    assert end - begin == pytest.approx(0.5) and called < end


def test_hops_times_zeromq_and_a_bare_socket_between_two_processes():
    from benchmark import hops
    figures = hops.measure(messages=50)
    assert set(figures) == {"send_after_idle_us", "send_back_to_back_us", "round_trip_us", "unix_round_trip_us"}
    assert all(value > 0 for value in figures.values()), figures
    # a round trip waits for another process to answer: it cannot be as quick as handing a message on
    assert figures["round_trip_us"] > figures["send_back_to_back_us"], figures


def test_the_bare_chain_answers_the_real_clients_as_the_server_does_and_leaves_nothing_behind():
    """benchmark/roofline.py's chain: zero rows of the zero backend's shape to the real client, its
    stages' CPU counted as the server's are, and at its stop no process or socket file of it left."""
    import psutil

    from benchmark import pipeline, roofline
    from encoder_client import EncoderClient
    with roofline.Chain() as chain:
        stages = psutil.Process(chain.process.pid).children(recursive=True)
        names = sorted(process.name() for process in stages)
        with EncoderClient("127.0.0.1", chain.port, chain.port_out, timeout=10) as client:
            rows = client.encode(["one text", "and another"])
            assert client.server_config["ready"] is True
        cell = pipeline.closed_loop(chain.port, chain.port_out, 4, 2, 0.5, 1, chain.process.pid, warmup=0.2)
        run_dir = next(Path(handle.laddr).parent for stage in stages for handle in stage.net_connections("unix")
                       if handle.laddr)
    assert rows.shape == (2, roofline.WIDTH) and rows.dtype == "float32" and not rows.any()
    assert names == ["sink", "ventilator", "worker-0", "worker-1"]
    assert cell["requests_per_s"] > 0 and cell["texts_per_s"] == pytest.approx(2 * cell["requests_per_s"])
    assert all(cell["cpu_us_per_request"][stage] > 0 for stage in ("ventilator", "sink", "workers")), cell
    deadline = time.monotonic() + 10
    while any(process.is_running() and process.status() != psutil.STATUS_ZOMBIE for process in stages):
        assert time.monotonic() < deadline, [process for process in stages if process.is_running()]
        time.sleep(0.05)
    assert not run_dir.exists()


def test_the_roofline_gives_each_engine_s_medians_and_the_service_s_share_of_the_chain_round_by_round():
    from benchmark import roofline

    def rounds(*rates):
        return [[{"cell": "32 clients x 32 short texts", "texts_per_s": texts, "requests_per_s": texts / 32,
                  "cpu_us_per_request": {"sink": texts / 100}},
                 {"cell": "32 clients x 1 short text", "texts_per_s": requests, "requests_per_s": requests,
                  "cpu_us_per_request": {"sink": requests / 10}}] for texts, requests in rates]
    rows = roofline.summarize({"service": rounds((30_000, 2_500), (20_000, 3_000), (25_000, 2_000)),
                               "bare chain": rounds((100_000, 5_000), (80_000, 4_000), (125_000, 4_000))})
    assert [(row["engine"], row["cell"]) for row in rows] == [
        (engine, cell) for engine in ("service", "bare chain")
        for cell in ("32 clients x 32 short texts", "32 clients x 1 short text")]
    service_batches, service_single, chain_batches, chain_single = rows
    assert service_batches["texts_per_s"] == 25_000 and service_batches["cpu_us_per_request"] == {"sink": 250}
    assert service_batches["of_chain"] == [0.3, 0.25, 0.2] and service_single["of_chain"] == [0.5, 0.75, 0.5]
    assert chain_single["requests_per_s"] == 4_000 and "of_chain" not in chain_batches


def test_client_cost_times_the_client_and_a_raw_loop_in_turns():
    from benchmark import client_cost
    figures = client_cost.measure(requests=30, rounds=2, pieces=True)
    ways = ("client", "raw", "raw+prepare", "raw+read")
    assert set(figures) == {f"{way}_{kind}" for way in ways for kind in ("us", "rounds")}, figures
    for way in ways:
        assert len(figures[f"{way}_rounds"]) == 2 and all(value > 0 for value in figures[f"{way}_rounds"]), figures
        assert figures[f"{way}_us"] == pytest.approx(sum(figures[f"{way}_rounds"]) / 2), figures


def test_a_service_that_does_not_start_is_reported_with_what_its_last_probe_saw(tmp_path):
    from benchmark.engines import Service
    with pytest.raises(RuntimeError, match=r"did not start \(the last probe: no answer from an encoder-server at "
                                           r"tcp://127\.0\.0\.1:\d+ within 1s.* \(TCP: Connection refused on \d+, "
                                           r"Connection refused on \d+\)\); see .*bench-\d+\.log"):
        with Service("no such model", model=tmp_path / "missing", log_dir=tmp_path):
            pass


def test_a_service_that_never_gets_ready_is_asked_again_from_a_process_of_its_own():
    from benchmark import engines, pipeline
    with engines.Service("zero", ("--backend", "zero", "--num-worker", "1"), env=pipeline.ZERO_BACKEND) as server:
        said = server.diagnosis()  # what a start that timed out would add to its error
    assert said.startswith("a client in a process of its own: {'ready': True, 'workers_alive': 1"), said


def test_start_stop_benchmark_reports_medians(tiny_model):
    result = subprocess.run([sys.executable, "-m", "benchmark.start_stop", "--model", str(tiny_model),
                             "--repeats", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(result.stdout)
    assert set(figures) == {"ready_s", "stop_s", "cpu_s"} and all(value > 0 for value in figures.values())
    assert figures["ready_s"] < 60 and figures["cpu_s"] > 0.1  # the reaped server's CPU, children included


def test_tokenizer_benchmark_times_each_tree_warm_and_cold_in_alternated_rounds(tmp_path):
    from benchmark import tokenizer
    this = str(ROOT)
    medians, ratios = tokenizer.compare([this, this], rounds=2, batches=2)
    assert list(medians) == [this] and ratios == {}  # one tree named twice is timed as one
    for kind in tokenizer.KINDS:
        figures = medians[this][kind]
        assert set(figures) == {"warm_us", "cold_us"} and all(value > 0 for value in figures.values()), medians
