"""The shared fixtures of tests/conftest.py (tiny prepared bundles, the private cache, fixed random
streams) for the research tests too: pytest reads a conftest only for the tests below it."""

from tests.conftest import (  # noqa: F401
    eagle3_bundle,
    eagle3_head,
    pair_bundle,
    private_cache,
    reproducible_unseeded_requests,
    smollm2_gguf,
)
