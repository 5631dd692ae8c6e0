"""The heap is trimmed once per idle spell and, under a load that never pauses, once per interval; the
arena cap leaves a user's MALLOC_ARENA_MAX alone."""

from __future__ import annotations

import time

import pytest

from xpuspec.server.allocator import ARENA_MAX_ENV, IdleTrimmer, _malloc_trim, limit_arenas


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


def test_a_load_that_never_pauses_is_trimmed_every_interval() -> None:
    trimmer = IdleTrimmer(busy=lambda: True, idle_s=0.05, busy_interval_s=0.05)
    if _malloc_trim() is None:
        return
    trimmer.tick()
    assert trimmer.trims == 0  # the interval has not passed since the start
    time.sleep(0.06)
    trimmer.tick()
    trimmer.tick()
    assert trimmer.trims == 1  # once per interval, however often it ticks


def test_the_arena_cap_leaves_a_users_malloc_arena_max_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ARENA_MAX_ENV, "4")
    assert limit_arenas() is False
    monkeypatch.delenv(ARENA_MAX_ENV)
    assert limit_arenas() is (_malloc_trim() is not None)  # glibc: mallopt takes it
