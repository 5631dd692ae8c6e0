"""The names of the latency section's rows: engines, row groups, and which group each is compared with."""

from __future__ import annotations

XPUSPEC, GENAI, TRANSFORMERS, LLAMA_CPP = "xpuspec", "OpenVINO GenAI", "transformers", "llama.cpp"
ADAPTIVE = "adaptive"
TREE_AUTO = "tree auto"  # xpuspec's tree speculation with the cost model's shapes (draft_tree="auto")

SAME, DEFAULT, EXACT = "same properties", "default", "exact"
XPUSPEC_DEFAULT, GENAI_DEFAULT, XPUSPEC_EXACT = f"{XPUSPEC} default", f"{GENAI} default", f"{XPUSPEC} exact"
XPUSPEC_EAGLE3, EAGLE3_KEY = f"{XPUSPEC} EAGLE-3", f"{XPUSPEC}/eagle3"
GENAI_EAGLE3, GENAI_EAGLE3_KEY = f"{GENAI} EAGLE-3", f"{GENAI}/eagle3"
# GenAI's prompt lookup (n-gram drafting), same properties: a peer for xpuspec's adaptive γ, which
# also drafts by prompt lookup beside the draft model (xpuspec.spec_decode.policy.prompt_lookup).
GENAI_LOOKUP, GENAI_LOOKUP_KEY = f"{GENAI} prompt lookup", f"{GENAI}/lookup"
# The engine label of each row group; the row's peer for the ÷ GenAI column.
PEER_OF = {XPUSPEC: GENAI, XPUSPEC_DEFAULT: GENAI_DEFAULT, XPUSPEC_EAGLE3: GENAI_EAGLE3}
# Where an adaptive (or tree) row looks for the peer's best configuration (target-only or a fixed γ).
BEST_PEERS_OF = {XPUSPEC: (GENAI, GENAI_LOOKUP)}
# Row groups without target-only rows of their own: their speed-ups are over this group's.
BASELINE_OF = {XPUSPEC_EAGLE3: XPUSPEC, GENAI_EAGLE3: GENAI}


def row_label(engine: str, draft_length: int | str | None) -> str:
    if draft_length is None:
        return f"{engine} target-only"
    if draft_length == ADAPTIVE:
        return f"{engine} speculative (adaptive γ)"
    if draft_length == TREE_AUTO:
        return f"{engine} speculative (tree, auto shape)"
    return f"{engine} speculative (γ={draft_length})"
