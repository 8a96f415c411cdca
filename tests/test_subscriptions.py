from encoder_server.subscriptions import Subscriptions


def test_reply_is_held_until_its_reader_subscribes():
    subs = Subscriptions(hold_seconds=5)
    assert not subs.is_listening(b"client-1")
    subs.hold(b"client-1", ["reply-1"], now=100.0)
    subs.hold(b"client-2", ["reply-2"], now=100.0)
    assert subs.releasable(now=101.0) == []
    subs.update(b"\x01client-1")
    assert subs.is_listening(b"client-1")
    assert subs.releasable(now=101.0) == [["reply-1"]]
    assert subs.releasable(now=101.0) == []


def test_held_reply_is_let_go_after_the_wait():
    subs = Subscriptions(hold_seconds=5)
    subs.hold(b"gone", ["reply"], now=100.0)
    assert subs.releasable(now=104.9) == []
    assert subs.releasable(now=105.0) == [["reply"]]


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
