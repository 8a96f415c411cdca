"""encoder_server.server.liveness: which workers are alive, without sockets (time is passed in)."""
from encoder_server.server.liveness import KEEP_OUT_SECONDS, Liveness
from encoder_server.server.messages import Ready

HOST = "this-host"


def books(*workers, now=0.0):
    liveness = Liveness(HOST, interval=1.0, liveness=5)
    for worker, pid, remote in workers:
        assert liveness.ready(worker, Ready(pid, HOST if not remote else "elsewhere", remote), now,
                              over_ipc=not remote) == []
    return liveness


def test_workers_heard_within_the_silence_limit_stay():
    liveness = books((b"w1", 11, False), (b"w2", 12, False))
    assert liveness.heard(b"w1", 4.0) and liveness.heard(b"w2", 4.9)
    assert liveness.silent(9.0) == [] and len(liveness) == 2


def test_a_silent_worker_is_lost_once_and_the_supervisor_kills_it():
    liveness = books((b"w1", 11, False), (b"w2", 12, False))
    liveness.heard(b"w2", 3.0)
    (loss,) = liveness.silent(5.5)
    assert (loss.worker, loss.pid, loss.kill) == (b"w1", 11, True) and "heartbeats" in loss.why
    assert liveness.silent(5.5) == [] and len(liveness) == 1 and liveness.local == 1
    assert not liveness.heard(b"w1", 6.0)  # given up for dead: what it says next is ignored


def test_a_remote_worker_has_no_pid_to_kill():
    liveness = books((b"far/worker-0:7", 7, True))
    (loss,) = liveness.silent(10.0)
    assert loss.pid is None and liveness.local == 0


def test_a_worker_on_another_host_with_a_local_looking_name_is_not_local():
    liveness = Liveness(HOST)
    liveness.ready(b"w", Ready(5, "another-host", remote=False), 0.0, over_ipc=True)
    assert liveness.local == 0 and liveness.exited(5, -9) == []


def test_a_peer_on_the_worker_port_that_claims_to_be_a_local_worker_is_not():
    """It names this host and a local worker's pid, but came over tcp: given up, it has no pid to
    kill, and its jobs do not count as crashed."""
    liveness = Liveness(HOST)
    liveness.ready(b"w", Ready(5, HOST, remote=False), 0.0, over_ipc=False)
    assert liveness.local == 0 and not liveness.is_local(b"w") and liveness.exited(5, -9) == []
    (loss,) = liveness.misbehaved(b"w", 1.0)
    assert loss.pid is None and not loss.crashed


def test_an_exit_reported_by_the_supervisor_loses_that_worker_and_counts_a_restart():
    liveness = books((b"w1", 11, False), (b"w2", 12, False))
    (loss,) = liveness.exited(12, -9)
    assert (loss.worker, loss.kill) == (b"w2", False) and "code -9" in loss.why
    assert liveness.restarts == 1
    assert liveness.exited(999, 1) == [] and liveness.restarts == 2  # a restart, of a worker never ready


def test_ready_again_is_the_loss_of_the_old_connection():
    liveness = books((b"w1", 11, False))
    (loss,) = liveness.ready(b"w1", Ready(11, HOST), 3.0, over_ipc=True)
    assert loss.worker == b"w1" and "again" in loss.why and not loss.kill and not loss.crashed
    assert len(liveness) == 1 and liveness.heard(b"w1", 4.0)


def test_unreachable_loses_a_known_worker_only():
    liveness = books((b"w1", 11, False))
    assert [loss.worker for loss in liveness.unreachable(b"w1")] == [b"w1"]
    assert liveness.unreachable(b"w1") == []


def test_heartbeats_are_due_once_per_interval():
    liveness = books((b"w1", 11, False), (b"w2", 12, True))
    assert sorted(liveness.beat_due(0.0)) == [b"w1", b"w2"]
    assert liveness.beat_due(0.5) == []
    assert sorted(liveness.beat_due(1.0)) == [b"w1", b"w2"]


def test_silence_while_the_ventilator_itself_stalled_does_not_count():
    """A 15 s parse once held the ventilator's loop: on its next turn every worker looked silent."""
    liveness = books((b"w1", 11, False), (b"w2", 12, False))
    liveness.heard(b"w1", 1.0)
    liveness.stalled(14.0)
    assert liveness.silent(15.5) == [] and len(liveness) == 2
    assert [loss.worker for loss in liveness.silent(19.5)] == [b"w2"]  # 0 + 14 + 5: silent after all


def test_a_misbehaving_worker_is_lost_without_blame_for_its_jobs_and_kept_out_a_while():
    liveness = books((b"w1", 11, False), (b"far", 7, True))
    assert liveness.is_local(b"w1") and not liveness.is_local(b"far")
    (loss,) = liveness.misbehaved(b"far", 10.0, "sent a part the sink could not use")
    assert loss.worker == b"far" and not loss.crashed and "could not use" in loss.why
    assert liveness.kept_out(b"far", 10.0 + KEEP_OUT_SECONDS - 1) and not liveness.kept_out(b"w1", 10.0)
    assert liveness.misbehaved(b"far", 11.0) == []  # already lost: nothing more to lose
    assert not liveness.kept_out(b"far", 11.0 + KEEP_OUT_SECONDS)  # it may join again


def test_a_misbehaving_local_worker_is_lost_as_if_it_had_crashed():
    """A local worker runs this server's code: a job may have made it send junk, so its jobs count
    as crashed, and one that fails on every worker fails its request instead of going round."""
    liveness = books((b"w1", 11, False))
    (loss,) = liveness.misbehaved(b"w1", 10.0, "sent a part the sink could not use")
    assert (loss.worker, loss.pid, loss.kill, loss.crashed) == (b"w1", 11, True, True)
