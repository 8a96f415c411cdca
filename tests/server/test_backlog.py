"""encoder_server.server.backlog: replies the sink keeps for later, within byte budgets."""
from encoder_server.server.backlog import MAX_RETRY_SECONDS, PER_TURN, STUCK_AFTER, Backlog

MB = 1 << 20


def published_to(sent, room=None):
    """A publish callback that records what it sends, with room for `room` replies (None: any)."""
    def publish(held):
        if room is not None and len(sent) >= room:
            return False
        sent.append(held.frames)
        return True
    return publish


def listening(*identities):
    return lambda identity: identity in identities


def backlog(per_identity=100 * MB, total=100 * MB, **waits):
    return Backlog(per_identity, total, **{"hold_seconds": 5, "slow_seconds": 30, **waits})


def test_reply_is_held_until_its_reader_subscribes():
    book, sent = backlog(), []
    assert book.hold(b"client-1", [b"reply-1"], now=100.0) == []
    book.hold(b"client-2", [b"reply-2"], now=100.0)
    assert book.release(published_to(sent), listening(), now=101.0) == [] and sent == []
    book.listening(b"client-1", now=101.0)
    assert book.release(published_to(sent), listening(b"client-1"), now=101.0) == [] and sent == [[b"reply-1"]]
    assert not book.owes(b"client-1") and book.owes(b"client-2")
    assert book.unread(b"client-1") == len(b"reply-1")  # published, maybe not read yet


def test_held_reply_is_let_go_after_the_wait_and_a_slow_reader_gets_a_longer_one():
    book = backlog()
    book.hold(b"gone", [b"reply"], now=100.0)
    book.hold(b"slow", [b"reply"], slow=True, now=100.0)
    assert book.release(published_to([], room=0), listening(b"slow"), now=104.9) == []
    assert [held.identity for held in book.release(published_to([], room=0), listening(b"slow"), now=105.0)] == [
        b"gone"]
    expired = book.release(published_to([], room=0), listening(b"slow"), now=130.0)
    assert [(held.identity, held.slow) for held in expired] == [(b"slow", True)]
    assert book.held_bytes == 0 and book.next_due() is None


def test_an_identity_past_its_budget_has_its_new_reply_refused():
    """What waits and the last two replies published (which ZeroMQ may hold) count alike."""
    book = backlog(per_identity=10)
    book.published(b"reader", 3)
    book.published(b"reader", 3)
    book.published(b"reader", 4)  # only the last two count
    assert book.unread(b"reader") == 7
    assert book.hold(b"reader", [b"123"], slow=True, now=100.0) == []
    refused = book.hold(b"reader", [b"1"], slow=True, now=100.0)
    assert [held.frames for held in refused] == [[b"1"]] and book.unread(b"reader") == 10
    assert book.hold(b"reader", [b"error"], slow=True, now=100.0, reserve=5) == []  # an error fits the reserve
    book.unsubscribed(b"reader")  # its queue is gone with its connection
    assert book.unread(b"reader") == 8


def test_past_the_total_the_largest_holder_gives_up_its_oldest_first():
    book = backlog(per_identity=100, total=10)
    for number in range(4):
        assert book.hold(b"hog", [b"%d" % number * 2], now=100.0) == []
    assert book.hold(b"small", [b"ab"], now=100.0) == []
    dropped = book.hold(b"other", [b"xyz"], now=100.0)
    assert [(held.identity, held.frames) for held in dropped] == [(b"hog", [b"00"]), (b"hog", [b"11"])]
    assert book.held_bytes == 9 and book.owes(b"small") and book.owes(b"other")
    refused = book.hold(b"hog", [b"big-one"], now=100.0)  # the largest holder itself: it is refused
    assert [held.frames for held in refused][-1] == [b"big-one"]


def test_a_slow_readers_replies_are_offered_in_order_up_to_the_first_it_has_no_room_for():
    """Each offer costs one refused send per slow reader, not one per reply it has waiting; a
    reader that takes none is offered replies ever more rarely, one that takes some at every
    release (the sink runs one whenever ZeroMQ reports room)."""
    book = backlog()
    for number in range(1000):
        book.hold(b"slow", [b"%d" % number], slow=True, now=100.0 + number / 1000)
    assert book.waits_for_room()
    offered = []

    def full(held):
        offered.append(held.frames)
        return False

    now = 101.0
    while now < 111.0:
        book.release(full, listening(b"slow"), now=now)
        now = max(now + 0.001, book.next_due())
    assert offered == [[b"0"]] * len(offered) and len(offered) < 120
    assert not book.waits_for_room() and book.next_due() - now <= MAX_RETRY_SECONDS
    sent = []
    now = book.next_due()
    book.release(published_to(sent, room=100), listening(b"slow"), now=now)
    assert sent == [[b"%d" % n] for n in range(min(100, PER_TURN))] and book.waits_for_room()
    while len(sent) < 400:
        book.release(published_to(sent, room=400), listening(b"slow"), now=now)
    assert sent == [[b"%d" % n] for n in range(400)] and book.waits_for_room()
    book.release(published_to(sent, room=400), listening(b"slow"), now=now + 2 * STUCK_AFTER)
    assert not book.waits_for_room()  # stuck again: offered on a timer
    expired = book.release(published_to([], room=0), listening(b"slow"), now=130.5)
    assert [held.frames for held in expired] == [[b"%d" % n] for n in range(400, 501)]


def test_readers_that_took_nothing_for_a_while_are_known():
    book = backlog()
    assert book.stalled(1.0, now=100.0) == []
    book.hold(b"reader", [b"1"], slow=True, now=100.0)
    book.hold(b"reader", [b"2"], slow=True, now=100.5)
    assert book.stalled(1.0, now=100.8) == []
    assert book.stalled(1.0, now=102.0) == [b"reader"]
    book.release(published_to([], room=1), listening(b"reader"), now=103.0)
    assert book.stalled(1.0, now=103.5) == []  # it took one at 103
    assert book.stalled(1.0, now=104.5) == [b"reader"]
    book.release(published_to([]), listening(b"reader"), now=104.5)
    assert book.stalled(1.0, now=200.0) == []  # nothing waits


def test_a_reader_that_takes_replies_is_offered_more_at_once():
    book, sent = backlog(), []
    for number in range(3 * PER_TURN):
        book.hold(b"reader", [b"%d" % number], slow=True, now=100.0)
    book.release(published_to(sent), listening(b"reader"), now=100.0)
    assert len(sent) == PER_TURN and book.waits_for_room()  # at the next release, after the other identities
    book.release(published_to(sent), listening(b"reader"), now=100.0)
    book.release(published_to(sent), listening(b"reader"), now=100.0)
    assert len(sent) == 3 * PER_TURN and not book.owes(b"reader")


def test_many_held_replies_are_released_by_identity_and_by_deadline():
    book = backlog()
    for number in range(20_000):
        book.hold(b"nobody-%d" % number, [b"reply"], now=100.0 + number / 10_000)
    book.hold(b"reader", [b"one"], now=100.5)
    book.hold(b"reader", [b"two"], now=100.6)
    book.listening(b"reader", now=100.7)
    sent = []
    assert book.release(published_to(sent), listening(b"reader"), now=101.0) == [] and sent == [[b"one"], [b"two"]]
    expired = book.release(published_to(sent), listening(b"reader"), now=106.0)
    assert len(expired) == 10_001 and {held.identity for held in expired} == {b"nobody-%d" % n for n in range(10_001)}
    assert len(book.release(published_to(sent), listening(b"reader"), now=108.0)) == 9_999
    assert book.release(published_to(sent), listening(b"reader"), now=200.0) == [] and len(sent) == 2
    assert book.held_bytes == 0


def test_what_is_owed_to_listening_readers_is_known():
    book = backlog()
    assert not book.owes_any(listening(b"reader"))
    book.hold(b"nobody-yet", [b"1"], now=100.0)
    assert not book.owes_any(listening(b"reader"))  # held for an identity nobody listens to
    book.hold(b"reader", [b"2"], slow=True, now=100.0)
    assert book.owes_any(listening(b"reader"))
    book.release(published_to([]), listening(b"reader"), now=100.5)
    assert not book.owes_any(listening(b"reader"))
