"""Per-request speculation and latency figures, as the API and the server report them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestStats:
    """Counts for one request. ``accepted_per_position[i]`` counts drafts accepted at draft position i."""

    arrival_time: float
    max_draft_tokens: int
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_output_tokens: int = 0
    target_passes: int = 0  # target passes that gave this request tokens (a decode burst has several)
    drafted: int = 0
    accepted: int = 0
    verification_steps: int = 0
    num_preemptions: int = 0
    # Prompt tokens whose target (draft) KV came from the prefix cache; None until admitted.
    cached_tokens: int | None = None
    cached_draft_tokens: int | None = None
    # A constrained request (response_format, guided_*): whether its output satisfied the constraint
    # when it finished (the matcher was accepting); None while running, and for unconstrained ones.
    constraint_complete: bool | None = None
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    # Tree speculation: trees verified, their nodes in all, and how many had each accepted depth.
    tree_verifications: int = 0
    tree_nodes_verified: int = 0
    accepted_depths: dict[int, int] = field(default_factory=dict)
    # Of ``drafted`` and ``accepted``: the drafts prompt lookup made beside the drafter.
    lookup_drafted: int = 0
    lookup_accepted: int = 0
    # Steps by what the speculation policy chose for this request: "prompt lookup", "draft model",
    # "tree", or why it drafted nothing ("off: measured slower", "off: predicted slower").
    drafting_decisions: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.drafted_per_position = [0] * self.max_draft_tokens
        self.accepted_per_position = [0] * self.max_draft_tokens

    def record_verification(self, num_drafted: int, num_accepted: int) -> None:
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.verification_steps += 1
        for position in range(min(num_drafted, self.max_draft_tokens)):
            self.drafted_per_position[position] += 1
            if position < num_accepted:
                self.accepted_per_position[position] += 1

    def record_lookup(self, num_drafted: int, num_accepted: int) -> None:
        self.lookup_drafted += num_drafted
        self.lookup_accepted += num_accepted

    def record_decision(self, decision: str) -> None:
        self.drafting_decisions[decision] = self.drafting_decisions.get(decision, 0) + 1

    def record_tree(self, num_nodes: int, accepted_depth: int) -> None:
        self.tree_verifications += 1
        self.tree_nodes_verified += num_nodes
        self.accepted_depths[accepted_depth] = self.accepted_depths.get(accepted_depth, 0) + 1

    def record_tokens(self, count: int, now: float) -> None:
        if count and self.first_token_time is None:
            self.first_token_time = now
        if count:
            self.last_token_time = now
            self.target_passes += 1
        self.num_output_tokens += count

    def drop_output_tokens(self, count: int) -> None:
        """Uncount the last ``count`` output tokens: they came after the end of a stop string."""
        if not 0 <= count <= self.num_output_tokens:
            raise ValueError(f"cannot drop {count} of {self.num_output_tokens} output tokens")
        self.num_output_tokens -= count

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def tokens_per_s(self) -> float | None:
        if self.first_token_time is None or self.last_token_time is None:
            return None
        elapsed = self.last_token_time - self.arrival_time
        return self.num_output_tokens / elapsed if elapsed > 0 else None

    @property
    def per_position_acceptance(self) -> list[float | None]:
        return [
            accepted / drafted if drafted else None
            for accepted, drafted in zip(self.accepted_per_position, self.drafted_per_position, strict=True)
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "per_position_acceptance": self.per_position_acceptance,
            "verification_steps": self.verification_steps,
            # Tokens each target pass emitted (accepted drafts plus the target's own token).
            "accepted_per_target_pass": (
                (self.accepted + self.verification_steps) / self.verification_steps
                if self.verification_steps
                else None
            ),
            "tree_verifications": self.tree_verifications,
            "tree_nodes_verified": self.tree_nodes_verified,
            "accepted_depths": dict(sorted(self.accepted_depths.items())),
            "lookup_drafted": self.lookup_drafted,
            "lookup_accepted": self.lookup_accepted,
            "drafting_decisions": dict(self.drafting_decisions),
            "num_output_tokens": self.num_output_tokens,
            "target_passes": self.target_passes,
            "num_preemptions": self.num_preemptions,
            "cached_tokens": self.cached_tokens or 0,
            "cached_draft_tokens": self.cached_draft_tokens or 0,
            "ttft_s": self.ttft_s,
            "tokens_per_s": self.tokens_per_s,
        }
