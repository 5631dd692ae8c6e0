"""EAGLE-3 drafting (Li et al. 2025): a one-layer draft head over the target's fused hidden states.

``config`` and ``weights`` read a head in the published Hugging Face layout; ``proposer`` drafts
chains and ``tree`` EAGLE-2-style dynamic trees (requests with ``draft_tree``). The head's OpenVINO
graphs and its executor live in :mod:`xpuspec.executor` (``eagle3_graph``, ``eagle3_embedding``,
``eagle3_head``).
"""
