"""Under CURVE with --authorized-clients, which client key owns each identity. Pure: no sockets.

An identity belongs to the first client key (its ZAP user id) that sends or subscribes under it;
another key may then neither send requests as it nor subscribe to its replies, so one authorized
client cannot pass for another. Clients that share one identity (multicast) must share a key.
Ownership is remembered for the last `limit` identities used.
"""
from collections import OrderedDict


class Owners:
    def __init__(self, limit=100_000):
        self.limit = limit
        self._owners = OrderedDict()  # identity -> user id

    def claim(self, identity, user):
        """Whether `user` may use `identity` (True for a user of None: no authentication)."""
        if user is None:
            return True
        owner = self._owners.get(identity)
        if owner is None:
            self._owners[identity] = owner = user
            if len(self._owners) > self.limit:
                self._owners.popitem(last=False)
        self._owners.move_to_end(identity)
        return owner == user
