"""The speculation policy: how much each sequence drafts, from measured costs and acceptance."""
