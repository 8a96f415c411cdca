from encoder_server.subscriptions import Subscriptions


def test_reply_is_held_until_its_reader_subscribes():
    subs = Subscriptions(hold_seconds=5)
    assert not subs.is_listening(b"client-1")
    subs.hold(b"client-1", ["reply-1"], now=100.0)
    subs.hold(b"client-2", ["reply-2"], now=100.0)
    assert subs.releasable(now=101.0) == []
    subs.update(b"\x01client-1")
    assert subs.is_listening(b"client-1")
    assert [held.frames for held in subs.releasable(now=101.0)] == [["reply-1"]]
    assert subs.releasable(now=101.0) == []


def test_held_reply_is_let_go_after_the_wait():
    subs = Subscriptions(hold_seconds=5)
    subs.hold(b"gone", ["reply"], now=100.0)
    assert subs.releasable(now=104.9) == []
    assert [held.frames for held in subs.releasable(now=105.0)] == [["reply"]]


def test_subscriptions_are_counted_per_subscriber():
    subs = Subscriptions()
    subs.update(b"\x01team")
    subs.update(b"\x01team")
    subs.update(b"\x00team")
    assert subs.is_listening(b"team")
    subs.update(b"\x00team")
    assert not subs.is_listening(b"team")
    subs.update(b"\x00never-subscribed")
    subs.update(b"")
    assert not subs.is_listening(b"never-subscribed")


def test_slow_reader_gets_a_longer_wait():
    subs = Subscriptions(hold_seconds=5, slow_seconds=30)
    subs.hold(b"slow", [b"reply"], now=100.0, slow=True)
    assert subs.releasable(now=129.0) == []
    assert [held.slow for held in subs.releasable(now=130.0)] == [True]


def test_held_replies_are_capped_in_bytes_oldest_first():
    subs = Subscriptions(max_held_bytes=10)
    for name in (b"a", b"b", b"c"):
        subs.hold(name, [b"12345"], now=100.0)
    assert subs.evicted == 1
    assert [held.identity for held in subs.releasable(now=200.0)] == [b"b", b"c"]
