"""Stream a chat answer through the bundle's chat template, sampled with a seed.

python samples/stream_chat.py "How do I read a file?" [BUNDLE]

Without BUNDLE: the default model, SmolLM2-135M-Instruct (a chat model). The demo pair is a code model
and is refused here (samples/generate.py takes it).
"""

import sys

from xpuspec import Pipeline, SamplingParams
from xpuspec.api.request_text import chat_by_default
from xpuspec.models.bundle import BundleError

question = sys.argv[1] if len(sys.argv) > 1 else "Write a function that reverses a string."
bundle = sys.argv[2] if len(sys.argv) > 2 else None
try:
    pipe = Pipeline(bundle=bundle)
except (BundleError, ValueError) as error:
    sys.exit(f"stream_chat.py: error: {error}")
if not chat_by_default(pipe.bundle):
    why = "has no chat template" if pipe.chat_template is None else "holds a model trained on plain text"
    sys.exit(
        f"stream_chat.py: error: {pipe.bundle.root} {why}; "
        "use samples/generate.py for plain-text prompts, or a bundle of a chat model"
    )
messages = [{"role": "user", "content": question}]
for piece in pipe.stream(messages, SamplingParams(max_tokens=96, temperature=0.7, top_p=0.95, seed=0)):
    print(piece, end="", flush=True)
print()
