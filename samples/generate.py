"""Generate with the embedded demo pair (or a bundle given as the first argument); show the speculation
figures.

    python samples/generate.py [BUNDLE]
"""

import sys

from xpuspec import Pipeline, SamplingParams
from xpuspec.model_bundle import BundleError

try:
    pipe = Pipeline(bundle=sys.argv[1] if len(sys.argv) > 1 else None)
except (BundleError, ValueError) as error:
    sys.exit(f"generate.py: error: {error}")
prompts = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n"]
for result in pipe.generate(prompts, SamplingParams(max_tokens=64, temperature=0.0)):
    stats = result.stats
    print(result.text)
    print(
        f"--- {result.finish_reason}; drafted {stats['drafted']}, accepted {stats['accepted']}, "
        f"{stats['tokens_per_s'] or 0:.0f} tokens/s\n"
    )
