"""Seconds from a command's spawn to the first byte it writes on stdout, over N runs (median printed).

python -m research.bench.first_output 5 xpuspec generate --max-tokens 8 "Write a haiku about caches"
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time


def first_output_seconds(command: list[str]) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ)
    )
    assert process.stdout is not None
    process.stdout.read(1)
    seconds = time.perf_counter() - started
    process.communicate()
    return seconds


def main(argv: list[str]) -> int:
    runs, command = int(argv[0]), argv[1:]
    times = [first_output_seconds(command) for _ in range(runs)]
    print(f"median {statistics.median(times):.2f} s; runs {', '.join(f'{t:.2f}' for t in times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
