"""Stream a chat answer through the bundle's chat template, sampled with a seed.

    python samples/stream_chat.py "How do I read a file?" [BUNDLE]
"""

import sys

from xpuspec import Pipeline, SamplingParams

question = sys.argv[1] if len(sys.argv) > 1 else "Write a function that reverses a string."
pipe = Pipeline(bundle=sys.argv[2] if len(sys.argv) > 2 else None)
messages = [{"role": "user", "content": question}]
for piece in pipe.stream(messages, SamplingParams(max_tokens=96, temperature=0.7, top_p=0.95, seed=0)):
    print(piece, end="", flush=True)
print()
