"""encoder_server.server.ownership: an identity belongs to the first client key that uses it."""
from encoder_server.server.ownership import Owners


def test_the_first_key_owns_an_identity():
    owners = Owners()
    assert owners.claim(b"alice-id", "alice-key")
    assert owners.claim(b"alice-id", "alice-key")
    assert not owners.claim(b"alice-id", "bob-key")
    assert owners.claim(b"bob-id", "bob-key")


def test_without_authentication_anyone_may_use_any_identity():
    owners = Owners()
    assert owners.claim(b"x", None) and owners.claim(b"x", None)
    assert owners.claim(b"x", "key") and owners.claim(b"x", None)


def test_ownership_is_remembered_for_the_most_recently_used_identities():
    owners = Owners(limit=2)
    owners.claim(b"a", "k1")
    owners.claim(b"b", "k1")
    owners.claim(b"a", "k1")   # a is now the most recent
    owners.claim(b"c", "k1")   # b is forgotten
    assert owners.claim(b"b", "k2")  # and a, the oldest now, is forgotten in turn
    assert not owners.claim(b"c", "k2") and owners.claim(b"a", "k2")
