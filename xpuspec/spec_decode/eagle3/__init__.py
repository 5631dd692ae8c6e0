"""EAGLE-3 drafting (Li et al. 2025): a one-layer draft head over the target's fused hidden states.

``config`` and ``weights`` read a head in the published Hugging Face layout (safetensors; a torch pickle
is converted by :mod:`xpuspec.prepare.eagle3`). ``head`` declares what drafting asks of the head's
executor (:class:`~xpuspec.spec_decode.eagle3.head.HeadExecutor`, its passes' inputs and outputs);
``head_state`` keeps what the head has seen of each sequence; ``proposer`` drafts chains and ``tree``
EAGLE-2-style dynamic trees (requests with ``draft_tree``), both on that shared state. Nothing here
imports OpenVINO: the head's graphs and its executor live in :mod:`xpuspec.executor` (``eagle3_graph``,
``eagle3_embedding``, ``eagle3_pass``, ``eagle3_chains``, ``eagle3_head``).
"""
