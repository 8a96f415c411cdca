"""encoder_server.server.supervisor: its children are forked (spawned where a model runs on cuda),
which is safe only while the supervisor runs one thread and never loads what keeps threads or locks
of its own (a zmq context, torch, onnxruntime, the tokenizers library): a child would inherit their
memory without their threads."""
import multiprocessing
import os
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import psutil

from conftest import running_server, wait_for

from encoder_server.server.supervisor import Supervisor, child_start_method
from encoder_server.settings import resolve

HEAVY_LIBRARIES = ("libtorch", "onnxruntime", "tokenizers")


def test_the_supervisor_forks_its_children_from_one_thread_without_zmq_or_model_runtimes(tiny_model, tmp_path):
    with running_server(tiny_model, "--num-worker", "1", tmp_path=tmp_path) as server, server.client() as client:
        client.encode(["a text to serve"])
        supervisor = psutil.Process(server.process.pid)
        children = {child.name(): child for child in supervisor.children()}
        assert all(children[name].cmdline() == supervisor.cmdline() for name in ("ventilator", "sink", "worker-0"))
        assert_fork_safe(supervisor.pid)

        children["worker-0"].kill()  # the supervisor forks a new one: still from a clean process
        wait_for(lambda: any(child.name() == "worker-0" and child.pid != children["worker-0"].pid
                             for child in supervisor.children()), timeout=30)
        assert client.encode(["served by the new worker"]).shape == (1, 32)
        assert_fork_safe(supervisor.pid)


def assert_fork_safe(pid):
    threads = os.listdir(f"/proc/{pid}/task")
    assert len(threads) == 1, f"the supervisor runs {len(threads)} threads: " + \
        ", ".join(Path(f"/proc/{pid}/task/{thread}/comm").read_text().strip() for thread in threads)
    loaded = Path(f"/proc/{pid}/maps").read_text()
    assert not [library for library in HEAVY_LIBRARIES if library in loaded]


def test_children_are_spawned_when_any_served_model_runs_on_cuda(tiny_model):
    """The launcher's questions to torch about the GPU start the CUDA driver in the supervisor, and a
    forked child could then use no CUDA (tests/cuda checks that such a server serves)."""
    settings = resolve(model=str(tiny_model))
    assert child_start_method(settings.all_models) == "fork"
    on_cuda = replace(settings, device="cuda")
    assert child_start_method(replace(settings, served=(settings, on_cuda)).all_models) == "spawn"


class ExitingWhileRead:
    """A child seen alive at the first read of its exit code and exited by the next, as when it exits
    while the supervisor looks: its later reads are the real process's."""

    def __init__(self, process):
        self.process, self.reads = process, 0

    def __getattr__(self, name):
        return getattr(self.process, name)

    @property
    def exitcode(self):
        self.reads += 1
        return None if self.reads == 1 else self.process.exitcode


def test_a_ventilator_that_drains_and_exits_while_the_supervisor_looks_stops_the_server(tiny_model):
    """Exit code 0 (drained after TERMINATION) stops the server, even when the ventilator exits
    between two looks: it was once restarted as a ventilator that died, and the server ran on."""
    context = multiprocessing.get_context("fork")
    drained, sink = context.Process(target=int), context.Process(target=time.sleep, args=(60,))
    drained.start()
    sink.start()
    drained.join(30)
    events, theirs = context.Pipe()
    theirs.close()  # as the exited ventilator's end is
    supervisor = Supervisor(resolve(model=str(tiny_model)))
    supervisor.ventilator, supervisor.sink, supervisor.events = ExitingWhileRead(drained), sink, events
    supervisor.pool = SimpleNamespace(sentinels=[], kill=lambda pid: None, restart_exited=lambda on_exit: None,
                                      cannot_start=lambda: None)
    restarted = []
    supervisor.start_ventilator = lambda: restarted.append("ventilator")
    try:
        assert supervisor.watch() is False
        assert restarted == [] and supervisor.ventilator.reads >= 2
    finally:
        sink.kill()
        sink.join(30)
        events.close()
