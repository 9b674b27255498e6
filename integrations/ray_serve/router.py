"""Ray Serve request router that keeps each conversation on the replica that holds its caches.

Ray Serve's custom request-router API (`ray.serve.request_router.RequestRouter`, Ray >= 2.46):
the ingress calls the engine deployment with `conversation=KEY` (affinity.py); this router, which
Ray runs inside every handle to that deployment, remembers which replica served each key and
sends the key's next requests there. A key seen for the first time, or whose replica is gone
(died, scaled down), goes to the replica holding the fewest conversations (ties broken at random;
the others follow as fallbacks, most free first) and is remembered there. Counted from the
router's own table, with a claim taken at the choice: several conversations starting at once
would all see equal queue lengths (Ray's "power of two choices" probe), and a 2-replica load
test put 3 of 4 on one replica that way. Requests with no key (/v1/models, unparseable bodies)
go to the less loaded of two replicas drawn at random (Ray probes their ongoing-request counts). Why a router and not model
multiplexing: multiplexing learns where an id lives from the replicas' periodic reports, so two
quick steps of a new conversation can land on two replicas, and it evicts ids by a per-replica
count rather than by the engine's own LRU; the router decides from its own table at once.

Ray pickles this module by value to ship the class to every handle's process, so the router
reaches shared state only through imports made at call time: routing outcomes are counted in
the process-wide `route_counts.ROUTES` (the ingress exports them on /metrics):
`affine` (sent to the replica that holds the conversation), `new` (first request of a key),
`moved` (its replica was gone: served cold elsewhere, correct but with a full prefill), `unkeyed`.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict

from ray.serve.request_router import FIFOMixin, PendingRequest, ReplicaID, RequestRouter, RunningReplica

MAX_CONVERSATIONS = 100_000  # keys remembered per router (LRU); a forgotten key is "new" again


def conversation_of(pending_request: PendingRequest | None) -> str | None:
    if pending_request is None:
        return None
    key = (pending_request.kwargs or {}).get("conversation")
    return key if isinstance(key, str) and key else None


class ConversationRouter(FIFOMixin, RequestRouter):
    """Affinity by conversation key, load balancing for new keys (module docstring)."""

    def initialize_state(self, max_conversations: int = MAX_CONVERSATIONS, **kwargs) -> None:
        self.max_conversations = int(max_conversations)
        self.owners: OrderedDict[str, ReplicaID] = OrderedDict()  # key -> replica, LRU order
        self.held: Counter = Counter()  # replica id -> conversations it holds or was chosen for
        self.claims: dict = {}  # new key -> the replica chosen for it, until it is routed

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        key = conversation_of(pending_request)
        owner = self.owners.get(key) if key is not None else None
        if owner is not None:
            replica = self.curr_replicas.get(owner)
            if replica is not None:
                # Only its own replica: if that one is busy the request waits for it (its own
                # queue answers 429 when full), it never goes cold to another replica.
                return [[replica]]
        if key is not None and candidate_replicas:
            return self._claim(key, list(candidate_replicas))
        if len(candidate_replicas) <= 2:
            return [list(candidate_replicas)]
        return [random.sample(list(candidate_replicas), 2)]

    def _claim(self, key: str, candidates: list) -> list[list[RunningReplica]]:
        """Ranks for a new key: the replica holding the fewest conversations first (claimed for
        the key until it is routed), then the others, fewest first."""
        previous = self.claims.pop(key, None)
        if previous is not None:  # asked again (its choice was full): the old claim lapses
            self.held[previous] -= 1
        ranked = sorted(candidates, key=lambda r: (self.held[r.replica_id], random.random()))
        self.claims[key] = ranked[0].replica_id
        self.held[ranked[0].replica_id] += 1
        return [[r] for r in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result) -> None:
        from asymagent.integrations.ray_serve.route_counts import ROUTES  # this process's

        key = conversation_of(pending_request)
        if key is None:
            ROUTES.add("unkeyed")
            return
        claimed = self.claims.pop(key, None)
        if claimed is not None:
            self.held[claimed] -= 1
        before = self.owners.get(key)
        ROUTES.add("new" if before is None else "affine" if before == replica_id else "moved")
        if before != replica_id:
            if before is not None:
                self.held[before] -= 1
            self.held[replica_id] += 1
        self.owners[key] = replica_id
        self.owners.move_to_end(key)
        while len(self.owners) > self.max_conversations:
            _, gone = self.owners.popitem(last=False)
            self.held[gone] -= 1
