"""The bench keeps third parties' chatter out of its output."""

from __future__ import annotations

import logging
import warnings

from xpuspec.bench.suite import quiet_third_parties


def test_third_party_deprecation_chatter_is_silenced() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_third_parties()
        for category in (FutureWarning, DeprecationWarning, UserWarning):
            warnings.warn_explicit(
                "`foo` is deprecated", category, "modeling_utils.py", 1, "transformers.modeling"
            )
        warnings.warn_explicit("ours", UserWarning, "suite.py", 1, "xpuspec.bench.suite")
    assert [str(w.message) for w in caught] == ["ours"]
    assert not logging.getLogger("transformers").isEnabledFor(logging.WARNING)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
