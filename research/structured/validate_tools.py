"""Tool calling at scale through the official ``openai`` client against a real ``xpuspec serve``.

    python -m research.structured.validate_tools [--bundle PATH] [--port 8765] [--json out.json]

For each of :data:`PROMPTS` (questions that call for one of :data:`TOOLS`), asks with
``tool_choice`` "auto", "required" and streamed "required", and reports: how many replies hold
parsed ``tool_calls`` whose arguments validate against the function's parameter schema, whether
"required" always yields a call, and whether streaming assembles the same calls as the
non-streamed reply (greedy, so both are the same generation: the server runs without prefix caching,
because at the default precision a prompt found in the cache is prefilled in a different chunk and
its u8 KV blocks are quantised differently, so greedy near-ties may flip). Not part of CI at this size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 40},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_currency",
            "description": "Convert an amount between currencies",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "minimum": 0, "maximum": 1e9},
                    "from": {"type": "string", "pattern": "^[A-Z]{3}$"},
                    "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
                },
                "required": ["amount", "from", "to"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_web",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "maxLength": 80}},
                "required": ["query"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "set_timer",
            "description": "Set a timer",
            "parameters": {
                "type": "object",
                "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 1440}},
                "required": ["minutes"],
                "additionalProperties": False,
            },
        },
    },
]
PROMPTS = [
    "What's the weather like in Paris right now?",
    "Is it raining in London? Use celsius.",
    "How hot is it in Phoenix in fahrenheit?",
    "Tell me the current weather in Tokyo.",
    "Weather in Berlin please.",
    "Convert 100 US dollars to euros.",
    "How many Japanese yen is 50 GBP?",
    "Change 2500 EUR into USD.",
    "What is 75 Canadian dollars in Swiss francs?",
    "Convert 10 euros to pounds.",
    "Search the web for the latest OpenVINO release notes.",
    "Find information about speculative decoding.",
    "Look up who won the 2022 World Cup.",
    "Search for a recipe for banana bread.",
    "Find the population of Canada online.",
    "Set a timer for 10 minutes.",
    "Remind me in 25 minutes with a timer.",
    "Start a 3 minute timer for my tea.",
    "I need a timer for one hour.",
    "Set a 45 minute timer for the laundry.",
    "What's the temperature in Madrid in celsius?",
    "Convert 1 bitcoin worth 60000 USD into EUR.",
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}


def _valid_calls(calls: Any) -> bool:
    import jsonschema

    if not calls:
        return False
    try:
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    except Exception:  # noqa: BLE001 - any bad name, JSON or schema mismatch counts as invalid
        return False
    return True


def run(base_url: str, model: str) -> dict[str, Any]:
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=300)
    counts = {"auto_calls": 0, "auto_valid": 0, "required_valid": 0, "stream_same": 0}
    failures = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        # Room for the most calls "required" allows (MAX_FORCED_CALLS, each up to ~45 tokens here).
        common = dict(model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=256)
        auto = client.chat.completions.create(tool_choice="auto", **common).choices[0]  # type: ignore[call-overload]
        if auto.message.tool_calls:
            counts["auto_calls"] += 1
            counts["auto_valid"] += _valid_calls(auto.message.tool_calls)
        required = client.chat.completions.create(tool_choice="required", **common).choices[0]  # type: ignore[call-overload]
        if required.finish_reason == "tool_calls" and _valid_calls(required.message.tool_calls):
            counts["required_valid"] += 1
        else:
            failures.append(
                {"prompt": prompt, "finish": required.finish_reason, "text": required.message.content}
            )
        assembled: dict[int, list[str]] = {}
        for chunk in client.chat.completions.create(tool_choice="required", stream=True, **common):  # type: ignore[call-overload]
            for choice in chunk.choices:
                for delta in choice.delta.tool_calls or []:
                    entry = assembled.setdefault(delta.index, ["", ""])
                    entry[0] += delta.function.name or ""
                    entry[1] += delta.function.arguments or ""
        expected = [[c.function.name, c.function.arguments] for c in required.message.tool_calls or []]
        streamed = [assembled[i] for i in sorted(assembled)]
        counts["stream_same"] += streamed == expected
        if streamed != expected:
            failures.append({"prompt": prompt, "streamed": streamed, "whole": expected})
    return {"prompts": len(PROMPTS), **counts, "failures": failures[:10]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", default=None)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "xpuspec.cli", "serve", "--port", str(args.port), "--no-prefix-caching"]
    if args.bundle:
        command += ["--bundle", args.bundle]
    server = subprocess.Popen(
        command, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        import httpx

        base = f"http://127.0.0.1:{args.port}"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode}")
            time.sleep(1)
        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        report = run(f"{base}/v1", model)
    finally:
        server.terminate()
        server.wait(60)
    text = json.dumps(report, indent=2)
    sys.stdout.write(text + "\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(text)
    return 0 if report["required_valid"] == report["prompts"] == report["stream_same"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
