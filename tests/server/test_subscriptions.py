"""encoder_server.server.subscriptions: which subscriptions the sink applies, and who listens."""

import pytest

from encoder_server.server.subscriptions import Change, Subscriptions, parse_change

LEGACY = b"0c51eb5a-50e5-4f5d-9f49-1d4ef9737ba1"  # what bert-serving-client subscribes to: a uuid4


def subscribe(topic):
    return parse_change(b"\x01" + topic)


def unsubscribe(topic):
    return parse_change(b"\x00" + topic)


@pytest.mark.parametrize("topic", [b"", b"a", b"victim", b"0", b"f", LEGACY[:35], LEGACY + b"x", LEGACY.upper(),
                                   b"a\0b\0", b"\0a\0", b"x" * 257 + b"\0", b"a\0\x01"])
def test_a_subscription_to_anything_but_one_whole_topic_is_refused(topic):
    """A SUB subscription matches by prefix: "", "a" or a UUID's first characters would match
    other clients' topics."""
    assert subscribe(topic) is None


def test_a_whole_topic_names_one_identity():
    assert subscribe(b"a\0") == Change(True, b"a")
    assert subscribe(b"\0") == Change(True, b"")
    assert unsubscribe(b"ab\0") == Change(False, b"ab")
    assert subscribe(b"x" * 256 + b"\0") == Change(True, b"x" * 256)
    assert subscribe(b"a\0").topic == b"a\0"


def test_bert_serving_clients_bare_uuid_is_applied_as_its_whole_topic():
    change = subscribe(LEGACY)
    assert change == Change(True, LEGACY, legacy=True) and change.topic == LEGACY + b"\0"


def test_subscriptions_are_counted_per_subscriber():
    subs = Subscriptions()
    assert subs.update(subscribe(b"team\0")) and subs.update(subscribe(b"team\0"))
    assert subs.update(unsubscribe(b"team\0")) and subs.is_listening(b"team")
    assert subs.update(unsubscribe(b"team\0")) and not subs.is_listening(b"team")
    assert not subs.update(unsubscribe(b"never-subscribed\0"))  # nothing to count down
    assert len(subs) == 0


def test_a_legacy_and_a_new_subscriber_of_one_identity_count_together():
    subs = Subscriptions()
    assert subs.update(subscribe(LEGACY)) and subs.update(subscribe(LEGACY + b"\0"))
    assert subs.update(unsubscribe(LEGACY)) and subs.is_listening(LEGACY)
    assert subs.update(unsubscribe(LEGACY + b"\0")) and not subs.is_listening(LEGACY)


def test_no_order_of_subscriptions_keeps_an_identity_from_being_listened_to():
    """Once, an accepted "a" made "ab" unsubscribable (and 16 one-character topics every UUID)."""
    subs = Subscriptions()
    for hostile in (b"0", b"1", b"a", b"f", b"", b"ab"):
        assert subscribe(hostile) is None
    assert subs.update(subscribe(b"a\0")) and subs.update(subscribe(b"ab\0")) and subs.update(subscribe(LEGACY))
    assert all(subs.is_listening(identity) for identity in (b"a", b"ab", LEGACY))


def test_a_refused_subscribers_departure_leaves_the_owner_listening():
    """XPUB reports an unsubscription for every topic a departing peer asked for, applied or not."""
    subs = Subscriptions()
    assert subs.update(subscribe(b"alice\0"), owned=True)
    assert not subs.update(subscribe(b"alice\0"), owned=False)          # bob, under CURVE, as alice
    assert not subs.update(unsubscribe(b"alice\0"), owned=False)        # bob's explicit unsubscribe: ignored
    assert subs.update(unsubscribe(b"alice\0")) and subs.is_listening(b"alice")  # bob's connection closes
    assert subs.update(unsubscribe(b"alice\0")) and not subs.is_listening(b"alice")  # alice goes
    assert not subs.update(subscribe(b"carol\0"), owned=False) and not subs.is_listening(b"carol")
