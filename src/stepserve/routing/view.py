"""What a router sees: each replica's load (ReplicaView) and the request to place
(RouteRequest); and what a router is (Router). A simulator replica builds its view from
its scheduler; a cluster replica reports the same numbers to Ray Serve's router."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


# made for every routing decision: not frozen (a frozen class's __init__ costs ~6x)
@dataclass(slots=True)
class ReplicaView:
    index: int  # position in the deployment, stable for the replica's life
    pool: str = "default"
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0  # share of KV blocks in use, 0..1

    @property
    def outstanding(self) -> int:
        """Requests it holds: the queue length a least-outstanding router compares."""
        return self.waiting + self.running


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """The facts about a request a routing rule may look at."""

    prompt_tokens: int
    max_tokens: int
    priority: int = 0  # lower runs first, as in vLLM
    tenant: str = "default"  # the OpenAI `user` field
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-cased names
    prompt_token_ids: Sequence[int] = ()  # what a prefix-aware router hashes
    cache_salt: str | None = None  # the prefix cache's namespace (core/prefix_hash.py)

    def __reduce__(self) -> tuple:
        # Pickled without the prompt: routers run where the request is routed (the
        # ingress), and a cluster replica gets the prompt as its own argument, so a long
        # prompt crosses the Ray seam once, not twice.
        return (RouteRequest, (self.prompt_tokens, self.max_tokens, self.priority,
                               self.tenant, dict(self.headers), (), self.cache_salt))


class Router:
    name = ""

    def pick(self, replicas: Sequence[ReplicaView], request: RouteRequest) -> int:
        """The position in `replicas` (never empty) of the replica to send to."""
        raise NotImplementedError
