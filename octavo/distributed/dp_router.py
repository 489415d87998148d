"""Which data-parallel replica gets a new request: load, with prefix affinity.

Load is what the front has routed to a replica and not yet seen finish:
requests and an estimate of their tokens (prompt tokens plus the new tokens
they may still generate, counted up to ``DECODE_TOKENS_ESTIMATE``). The
front knows this exactly and at once, without asking the replicas.

Affinity: every full prompt block's chained hash (the same hash the prefix
cache uses, salt included) is remembered with the replica it was last sent
to, in a bounded LRU table. A request whose longest remembered prefix lives
on replica ``r`` goes to ``r`` unless ``r`` is busier than the least-loaded
replica by more than the tokens the hit would save plus
``affinity_slack_tokens``; then it goes to the least-loaded replica, which
from then on owns that prefix.

Invariants: loads never go negative (a request is counted once, removed
once); the table never exceeds ``max_prefix_entries``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# New tokens a request is expected to cost before it finishes (a request
# asking for 4096 tokens usually stops far earlier).
DECODE_TOKENS_ESTIMATE = 128


@dataclass
class ReplicaLoad:
    num_requests: int = 0
    num_tokens: int = 0
    # Requests ever routed here (for stats and tests).
    num_routed: int = 0
    num_affinity_hits: int = 0


@dataclass
class RoutingDecision:
    replica: int
    num_prefix_tokens: int  # tokens of the prompt expected in that replica's prefix cache


class PrefixAwareRouter:
    def __init__(
        self,
        num_replicas: int,
        block_size: int,
        affinity_slack_tokens: int = 512,
        max_prefix_entries: int = 1 << 18,
    ) -> None:
        self.block_size = block_size
        self.affinity_slack_tokens = affinity_slack_tokens
        self.max_prefix_entries = max_prefix_entries
        self.loads = [ReplicaLoad() for _ in range(num_replicas)]
        self._prefix_owner: OrderedDict[bytes, int] = OrderedDict()
        self._costs: dict[str, tuple[int, int]] = {}  # request id -> (replica, tokens)

    @staticmethod
    def cost(num_prompt_tokens: int, max_new_tokens: int) -> int:
        return num_prompt_tokens + min(max_new_tokens, DECODE_TOKENS_ESTIMATE)

    def choose(self, block_hashes: list[bytes]) -> RoutingDecision:
        least = min(range(len(self.loads)), key=lambda i: (self.loads[i].num_tokens, self.loads[i].num_requests, i))
        for num_blocks in range(len(block_hashes), 0, -1):
            owner = self._prefix_owner.get(block_hashes[num_blocks - 1])
            if owner is None:
                continue
            saved = num_blocks * self.block_size
            if self.loads[owner].num_tokens - self.loads[least].num_tokens <= saved + self.affinity_slack_tokens:
                return RoutingDecision(owner, saved)
            break
        return RoutingDecision(least, 0)

    def add(self, request_id: str, decision: RoutingDecision, block_hashes: list[bytes], tokens: int) -> None:
        load = self.loads[decision.replica]
        load.num_requests += 1
        load.num_tokens += tokens
        load.num_routed += 1
        load.num_affinity_hits += decision.num_prefix_tokens > 0
        self._costs[request_id] = (decision.replica, tokens)
        for block_hash in block_hashes:
            self._prefix_owner[block_hash] = decision.replica
            self._prefix_owner.move_to_end(block_hash)
        while len(self._prefix_owner) > self.max_prefix_entries:
            self._prefix_owner.popitem(last=False)

    def remove(self, request_id: str) -> None:
        """The request finished or was aborted."""
        entry = self._costs.pop(request_id, None)
        if entry is None:
            return
        replica, tokens = entry
        self.loads[replica].num_requests -= 1
        self.loads[replica].num_tokens -= tokens

    def request_ids(self) -> list[str]:
        """Requests routed and not yet finished or aborted."""
        return list(self._costs)

    def replica_of(self, request_id: str) -> int | None:
        entry = self._costs.get(request_id)
        return None if entry is None else entry[0]
