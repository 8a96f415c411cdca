"""Who listens on the sink's result port, and for which client identity. Pure: no sockets.

Every reply goes out under its client's topic, the identity followed by a NUL byte that no
identity holds (protocol.topic). A SUB socket's subscription matches by prefix, so the sink's
XPUB, in manual mode, applies only a subscription to one whole topic, which matches that one
identity and no other: no subscription, in whatever order, can read another identity's replies
or keep another client from its own. bert-serving-client 1.10 subscribes to its bare identity, a
UUID; the sink applies that as the UUID's topic, so the old client works unchanged and still
sees nothing else. Anything else (the empty subscription, a prefix, a name without its NUL) is
refused. There is no cap on subscriptions: a cap would let one peer's flood lock others out.

XPUB reports every subscribe, and when a subscriber goes an unsubscribe for each topic it asked
for, applied or refused alike: so an identity counts the subscriptions to it (refused ones too,
once it is listened to) and is listened to until none is left.
"""
import re
from collections import Counter
from dataclasses import dataclass

from encoder_client.protocol import TOPIC_END, check_identity, topic

LEGACY_IDENTITY = re.compile(rb"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\Z")  # bert-serving-client's uuid4


@dataclass(frozen=True)
class Change:
    """A subscribe (or unsubscribe) to one identity's topic; `legacy`: asked as the bare UUID."""
    subscribe: bool
    identity: bytes
    legacy: bool = False

    @property
    def topic(self):
        """What the sink applies to the subscriber's connection."""
        return topic(self.identity)


def parse_change(message):
    """The Change an XPUB message asks for, or None when it names no whole topic."""
    if len(message) < 2 or message[0] not in (0, 1):
        return None
    subscribe, asked = message[0] == 1, bytes(message[1:])
    if asked.endswith(TOPIC_END):
        try:
            return Change(subscribe, check_identity(asked[:-1]))
        except ValueError:
            return None
    if LEGACY_IDENTITY.match(asked):
        return Change(subscribe, asked, legacy=True)
    return None


class Subscriptions:
    def __init__(self):
        self._listeners = Counter()  # identity -> subscriptions to it

    def update(self, change, owned=True):
        """Count one Change; True when the sink is to apply it. `owned`: False when, under CURVE,
        the identity belongs to another client key than the subscriber's."""
        if not change.subscribe:
            return owned and self._forget_one(change.identity)
        if change.identity in self._listeners:
            self._listeners[change.identity] += 1
            return owned
        if owned:
            self._listeners[change.identity] = 1
        return owned

    def _forget_one(self, identity):
        """Count one subscription to `identity` gone; False if it was never counted (it was refused)."""
        if identity not in self._listeners:
            return False
        self._listeners[identity] -= 1
        if not self._listeners[identity]:
            del self._listeners[identity]
        return True

    def is_listening(self, identity):
        return identity in self._listeners

    def __len__(self):
        return len(self._listeners)
