"""The heap is trimmed once per idle spell, never while requests are in flight."""

from __future__ import annotations

import time

from xpuspec.server.allocator import IdleTrimmer, _malloc_trim


def test_a_trim_follows_each_idle_spell_once() -> None:
    busy = [False]
    trimmer = IdleTrimmer(busy=lambda: busy[0], idle_s=0.05)
    if _malloc_trim() is None:  # not glibc: nothing to call
        trimmer.tick()
        assert trimmer.trims == 0
        return
    trimmer.tick()
    assert trimmer.trims == 0  # nothing ran yet: nothing to give back
    busy[0] = True
    trimmer.tick()
    busy[0] = False
    trimmer.tick()
    assert trimmer.trims == 0  # idle, but not for long enough
    time.sleep(0.06)
    trimmer.tick()
    trimmer.tick()
    assert trimmer.trims == 1  # once per spell
    busy[0] = True
    trimmer.tick()
    time.sleep(0.06)
    trimmer.tick()
    assert trimmer.trims == 1  # busy: never
