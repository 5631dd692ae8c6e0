"""Generate code with the embedded demo pair, or with a bundle given as the first argument; show the
speculation figures.

    python samples/generate.py [BUNDLE]

The demo pair is a code model: the prompts go in as they are. The bundle of a chat model (one whose
manifest has a chat template, such as the default model's) gets them as chat messages instead, as
``xpuspec generate`` does. samples/stream_chat.py uses the default model, SmolLM2-135M-Instruct.
"""

import sys

from xpuspec import Pipeline, SamplingParams
from xpuspec.api.request_text import chat_by_default
from xpuspec.models.bundle import BundleError

try:
    pipe = Pipeline(bundle=sys.argv[1] if len(sys.argv) > 1 else "demo")
except (BundleError, ValueError) as error:
    sys.exit(f"generate.py: error: {error}")
prompts = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(path):\n", "class Stack:\n"]
if chat_by_default(pipe.bundle):
    requests = [[{"role": "user", "content": f"Complete this Python code:\n{p}"}] for p in prompts]
else:
    requests = prompts
for result in pipe.generate(requests, SamplingParams(max_tokens=64, temperature=0.0)):
    stats = result.stats
    print(result.text)
    print(
        f"--- {result.finish_reason}; drafted {stats['drafted']}, accepted {stats['accepted']}, "
        f"{stats['tokens_per_s'] or 0:.0f} tokens/s\n"
    )
