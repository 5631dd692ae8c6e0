"""Calibration timings kept between starts: a pipeline that starts again on the same models, with the
same properties, devices and engine limits, on the same machine, replays the timings its first start
measured instead of timing dozens of dummy steps again.

The stored figures only seed the cost model: every real step refreshes it, as after a fresh
calibration. A changed machine (CPU, core count), OpenVINO or xpuspec version makes another key.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpuspec.engine.calibration import CalibrationTimings
from xpuspec.models.bundle import cache_dir
from xpuspec.version import __version__

if TYPE_CHECKING:
    from xpuspec.engine.engine import LLMEngine

logger = logging.getLogger(__name__)

FOLDER = "calibration"
FORMAT = 2  # 2: the largest batch is timed too


def machine_facts() -> dict[str, Any]:
    """What makes timings from one machine wrong on another."""
    import openvino as ov

    return {
        "cpu": _cpu_model(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "openvino": ov.__version__,
        "xpuspec": __version__,
        "format": FORMAT,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def calibration_key(setup: dict[str, Any]) -> str:
    """A stable key of ``setup`` (models, properties, devices, limits) and this machine."""
    payload = json.dumps({"setup": setup, "machine": machine_facts()}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def load(key: str) -> CalibrationTimings | None:
    path = cache_dir() / FOLDER / f"{key}.json"
    try:
        return CalibrationTimings.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        logger.debug("ignoring the stored calibration %s (%s)", path, error)
        return None


def store(key: str, timings: CalibrationTimings) -> None:
    """Write atomically; a cache that cannot be written only costs a calibration next start."""
    folder = cache_dir() / FOLDER
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".calibration-")
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            json.dump(timings.to_json(), stream)
        os.replace(temporary, folder / f"{key}.json")
    except OSError as error:
        logger.debug("cannot store the calibration (%s); the next start calibrates again", error)


def calibrate(engine: LLMEngine, setup: dict[str, Any] | None) -> None:
    """Calibrate ``engine``'s cost model, replaying the timings an earlier start with the same
    ``setup`` on this machine stored while they still hold (and storing new ones where there were none
    or they no longer held); None: time them."""
    if setup is None:
        engine.calibrate()
        return
    key = calibration_key(setup)
    stored = load(key)
    timings = engine.calibrate(stored=stored)
    if timings is not stored:
        store(key, timings)
