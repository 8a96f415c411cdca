from encoder_server.subscriptions import Subscriptions


def published_to(sent, room=None):
    """A publish callback that records what it sends, with room for `room` replies (None: any)."""
    def publish(held):
        if room is not None and len(sent) >= room:
            return False
        sent.append(held.frames)
        return True
    return publish


def test_reply_is_held_until_its_reader_subscribes():
    subs, sent = Subscriptions(hold_seconds=5), []
    assert not subs.is_listening(b"client-1")
    subs.hold(b"client-1", ["reply-1"], now=100.0)
    subs.hold(b"client-2", ["reply-2"], now=100.0)
    assert subs.release(published_to(sent), now=101.0) == [] and sent == []
    subs.update(b"\x01client-1")
    assert subs.is_listening(b"client-1")
    assert subs.release(published_to(sent), now=101.0) == [] and sent == [["reply-1"]]
    assert subs.release(published_to(sent), now=101.0) == [] and sent == [["reply-1"]]


def test_held_reply_is_let_go_after_the_wait():
    subs, sent = Subscriptions(hold_seconds=5), []
    subs.hold(b"gone", ["reply"], now=100.0)
    assert subs.release(published_to(sent), now=104.9) == []
    assert [held.frames for held in subs.release(published_to(sent), now=105.0)] == [["reply"]] and sent == []


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
    subs.update(b"\x01slow")
    subs.hold(b"slow", [b"reply"], now=100.0, slow=True)
    assert subs.release(published_to([], room=0), now=129.0) == []
    assert [held.slow for held in subs.release(published_to([], room=0), now=130.0)] == [True]


def test_held_replies_are_capped_in_bytes_soonest_due_first():
    subs = Subscriptions(max_held_bytes=10)
    for name in (b"a", b"b", b"c"):
        subs.hold(name, [b"12345"], now=100.0)
    assert subs.evicted == 1
    assert [held.identity for held in subs.release(published_to([]), now=200.0)] == [b"b", b"c"]


def test_only_topics_that_overlap_no_accepted_topic_are_accepted():
    """A SUB topic matches by prefix: accepting "vic" beside "victim" would hand the victim's
    replies to the other subscriber too."""
    subs = Subscriptions()
    assert subs.update(b"\x01") is None                       # empty: every reply
    assert subs.update(b"\x01victim") == (True, b"victim")
    assert subs.update(b"\x01victim") == (True, b"victim")    # a second subscriber of the same identity
    for overlapping in (b"v", b"vic", b"victim2", b"victim-and-more"):
        assert subs.update(b"\x01" + overlapping) is None, overlapping
        assert not subs.is_listening(overlapping)
    assert subs.update(b"\x01other") == (True, b"other")
    assert subs.update(b"\x00victim") and subs.update(b"\x00victim")
    assert subs.update(b"\x01vic") == (True, b"vic")          # free again once "victim" has no subscriber
    assert subs.update(b"\x00nobody") is None                 # never accepted: nothing to count down


def test_topics_are_capped():
    subs = Subscriptions(max_topics=3)
    for name in (b"a1", b"b1", b"c1"):
        assert subs.update(b"\x01" + name)
    assert subs.update(b"\x01d1") is None and subs.update(b"\x01a1")


def test_topics_are_capped_per_peer_so_one_peers_flood_leaves_room_for_others():
    subs = Subscriptions(max_topics=10, max_topics_per_peer=3)
    for name in (b"f1", b"f2", b"f3"):
        assert subs.update(b"\x01" + name, peer="10.0.0.9")
    assert subs.update(b"\x01f4", peer="10.0.0.9") is None
    assert subs.update(b"\x01good", peer="10.0.0.1") == (True, b"good")
    assert subs.update(b"\x00f1", peer="10.0.0.9") == (False, b"f1")  # it leaves one: room for one more
    assert subs.update(b"\x01f5", peer="10.0.0.9") == (True, b"f5")


def test_a_refused_subscribers_departure_leaves_the_owner_listening():
    """XPUB reports an unsubscription for every topic a departing peer asked for, applied or not."""
    subs = Subscriptions()
    assert subs.update(b"\x01alice", owned=True)
    assert subs.update(b"\x01alice", owned=False) is None          # bob, under CURVE, as alice
    assert subs.update(b"\x01ali") is None                         # an eavesdropper's prefix
    assert subs.update(b"\x00alice", owned=False) is None          # bob's explicit unsubscribe: ignored
    assert subs.update(b"\x00alice") and subs.is_listening(b"alice")   # bob's connection closes
    assert subs.update(b"\x00ali") is None                        # the eavesdropper goes (never applied)
    assert subs.is_listening(b"alice")
    assert subs.update(b"\x00alice") and not subs.is_listening(b"alice")  # alice goes


def test_a_slow_readers_replies_are_offered_in_order_up_to_the_first_it_has_no_room_for():
    """Each turn costs one refused send per slow reader, not one per reply it has held."""
    subs = Subscriptions(hold_seconds=5, slow_seconds=30)
    subs.update(b"\x01slow")
    for number in range(1000):
        subs.hold(b"slow", [b"%d" % number], now=100.0 + number / 1000, slow=True)
    offered = []

    def full(held):
        offered.append(held.frames)
        return False

    for turn in range(3):
        assert subs.release(full, now=102.0 + turn) == []
    assert offered == [[b"0"]] * 3
    sent = []
    assert subs.release(published_to(sent, room=400), now=105.0) == [] and sent == [[b"%d" % n] for n in range(400)]
    expired = subs.release(published_to([], room=0), now=130.5)
    assert [held.frames for held in expired] == [[b"%d" % n] for n in range(400, 501)]
    assert len(subs.release(published_to([], room=0), now=200.0)) == 499
    assert subs.release(published_to(sent), now=300.0) == [] and len(sent) == 400


def test_many_held_replies_are_released_by_identity_and_by_deadline():
    subs = Subscriptions(hold_seconds=5)
    for number in range(20_000):
        subs.hold(b"nobody-%d" % number, [b"reply"], now=100.0 + number / 10_000)
    subs.hold(b"reader", [b"one"], now=100.5)
    subs.hold(b"reader", [b"two"], now=100.6)
    subs.update(b"\x01reader")
    sent = []
    assert subs.release(published_to(sent), now=101.0) == [] and sent == [[b"one"], [b"two"]]
    expired = subs.release(published_to(sent), now=106.0)
    assert len(expired) == 10_001 and {held.identity for held in expired} == {b"nobody-%d" % n for n in range(10_001)}
    assert len(subs.release(published_to(sent), now=108.0)) == 9_999
    assert subs.release(published_to(sent), now=200.0) == [] and len(sent) == 2
