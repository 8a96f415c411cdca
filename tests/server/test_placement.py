"""encoder_server.server.placement: which CPUs each process of the server runs on, and a real server's
processes kept there (each thread of each, a restarted worker included), or left where the OS likes."""
import os
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from conftest import running_server, wait_for

from encoder_server.server.placement import cpus_taken, describe, layout


def test_two_cpus_take_the_ventilator_and_a_worker_and_the_sink_and_the_other():
    assert layout({0, 1}, {"worker-0": 1, "worker-1": 1}) == {
        "ventilator": {0}, "sink": {1}, "worker-0": {0}, "worker-1": {1}}


def test_the_turn_starts_where_the_offset_says_so_that_servers_on_one_host_spread():
    assert layout({0, 1, 2, 3}, {"worker-0": 1}, offset=5) == {"ventilator": {1}, "sink": {2}, "worker-0": {3}}
    assert layout({0, 1, 2, 3}, {"worker-0": 1}, offset=7) == {"ventilator": {3}, "sink": {0}, "worker-0": {1}}


def test_workers_take_their_count_in_turn_and_the_last_wraps_around_where_cpus_run_out():
    placed = layout(set(range(8)), {f"worker-{index}": 2 for index in range(4)})
    assert placed == {"ventilator": {0}, "sink": {1}, "worker-0": {2, 3}, "worker-1": {4, 5}, "worker-2": {6, 7},
                      "worker-3": {0, 1}}


def test_only_the_cpus_given_are_used_and_a_count_past_them_takes_them_all():
    placed = layout({9, 3, 7}, {"worker-0": 5, "worker-1": 0})
    assert placed == {"ventilator": {3}, "sink": {7}, "worker-0": {3, 7, 9}, "worker-1": {9}}


def test_one_cpu_has_nothing_to_keep_apart():
    assert layout({4}, {"worker-0": 1}) == {}


def test_a_worker_takes_its_share_or_what_its_threads_compute_on_where_that_is_more():
    def worker(device="cpu", backend="onnx", lanes=1, threads=1, tokenizers=1):
        return SimpleNamespace(device=device, backend=backend, lanes=lanes, threads_per_worker=threads,
                               tokenizer_threads=tokenizers)
    assert cpus_taken(worker(lanes=2), workers=1, cpus=2) == 2            # the lone onnx worker: every CPU
    assert cpus_taken(worker(backend="torch"), workers=2, cpus=2) == 1    # a torch worker per CPU
    assert cpus_taken(worker(lanes=4, threads=2), workers=2, cpus=4) == 4  # its lanes' threads, all it may have
    assert cpus_taken(worker(device="cuda", backend="torch"), workers=8, cpus=16) == 2  # its share
    assert cpus_taken(worker(device="cuda", backend="torch", tokenizers=3), workers=8, cpus=16) == 3
    assert cpus_taken(worker(backend="zero", lanes=4, threads=4), workers=2, cpus=2) == 1  # a fast device's
    # own compute is its tokenizing threads, not its lanes'


def test_the_log_names_each_process_s_cpus():
    assert describe({"ventilator": {1}, "worker-0": {3, 2}}) == "ventilator on 1, worker-0 on 2,3"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: the server pins nothing")
def test_a_server_keeps_each_process_and_each_of_its_threads_on_its_cpus_a_restarted_worker_too(
        tiny_model, tmp_path):
    allowed = os.sched_getaffinity(0)
    with running_server(tiny_model, "--pin-cpus", "--num-worker", "2", "--lanes", "1", "--threads-per-worker", "1",
                        tmp_path=tmp_path) as server, server.client() as client:
        client.encode(["served while pinned"])
        placed = cpus_of_children(server.process.pid)
        assert set(placed) == {"ventilator", "sink", "worker-0", "worker-1"}
        assert len(placed["ventilator"]) == len(placed["sink"]) == 1 and placed["ventilator"] != placed["sink"]
        share = len(allowed) // 2
        assert len(placed["worker-0"]) == len(placed["worker-1"]) == share
        assert not placed["worker-0"] & placed["worker-1"] and set().union(*placed.values()) <= allowed
        assert "processes pinned to CPUs: " in server.log

        old = next(child for child in psutil.Process(server.process.pid).children() if child.name() == "worker-0")
        old.kill()
        wait_for(lambda: any(child.name() == "worker-0" and child.pid != old.pid
                             for child in psutil.Process(server.process.pid).children()), timeout=30)
        assert client.encode(["served by the new worker"]).shape == (1, 32)
        assert cpus_of_children(server.process.pid)["worker-0"] == placed["worker-0"]


def test_by_default_every_process_may_run_anywhere(tiny_model, tmp_path):
    allowed = os.sched_getaffinity(0)
    with running_server(tiny_model, "--num-worker", "2", tmp_path=tmp_path) as server, server.client() as client:
        client.encode(["served where the OS likes"])
        assert set(cpus_of_children(server.process.pid).values()) == {frozenset(allowed)}
        assert "pinned" not in server.log


def cpus_of_children(pid):
    """{name of the server's ventilator, sink or a worker: the CPUs its threads may run on}, once every
    thread of each has the same (the supervisor's other children, such as multiprocessing's resource
    tracker, are not the server's to place)."""
    placed = {}
    for child in psutil.Process(pid).children():
        if not (child.name() in ("ventilator", "sink") or child.name().startswith("worker-")):
            continue
        masks = {frozenset(os.sched_getaffinity(int(task.name))) for task in Path(f"/proc/{child.pid}/task").iterdir()}
        assert len(masks) == 1, f"the threads of {child.name()} run on different CPUs: {masks}"
        placed[child.name()] = masks.pop()
    return placed
