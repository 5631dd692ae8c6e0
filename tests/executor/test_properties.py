"""Compile-property presets and the layering of plan-tuned properties under the user's."""

from __future__ import annotations

import pytest

from xpuspec.executor.properties import (
    EXACT_PROPERTIES,
    KEY_QUANT_MODE,
    PER_TOKEN_KEYS,
    is_exact,
    layer_tuned,
    readable,
    resolve_properties,
    with_preset,
)


def test_exact_preset_turns_off_every_approximation():
    exact = resolve_properties("exact")
    assert exact == {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0,
    }
    assert is_exact(exact) and resolve_properties(" EXACT ") == exact
    exact["KV_CACHE_PRECISION"] = "u8"  # a copy: the preset itself stays put
    assert EXACT_PROPERTIES["KV_CACHE_PRECISION"] == "f32" and not is_exact(exact)
    assert not is_exact({"INFERENCE_PRECISION_HINT": "f32"}) and not is_exact(None)


def test_the_stable_preset_keeps_f32_compute_and_cache_but_quantised_activations():
    assert resolve_properties("stable") == {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
    }
    assert not is_exact(resolve_properties("stable"))


@pytest.mark.smollm2
@pytest.mark.slow
def test_the_stable_preset_on_the_default_model_changes_no_text(smollm2_gguf):
    """On the default model the defaults' bf16 compute and u8 cache let drafting and batch mates flip
    near-ties; the stable preset (f32 compute, f32 cache) does not: speculative = target-only, and the
    same requests again, all in flight with their prompts cached, give the same text."""
    from xpuspec import Pipeline
    from xpuspec.planning.agreement import compare, greedy_token_ids

    prompts = [[{"role": "user", "content": text}] for text in INSTRUCTIONS]
    alone = Pipeline(None, drafter="none", properties="stable", use_placement=False)
    reference = greedy_token_ids(alone, prompts, 64)
    assert compare(reference, greedy_token_ids(alone, prompts, 64, in_flight=len(prompts))).all_same
    speculative = Pipeline(None, properties="stable", use_placement=False)
    assert compare(reference, greedy_token_ids(speculative, prompts, 64)).all_same


INSTRUCTIONS = [
    "Explain lighthouses in simple terms.",
    "Give me three facts about the violin.",
    "Write a short paragraph about origami.",
]


def test_unknown_presets_and_types_are_refused():
    with pytest.raises(ValueError, match="presets: exact"):
        resolve_properties("fast")
    with pytest.raises(ValueError, match="got int"):
        resolve_properties(3)  # type: ignore[arg-type]
    assert resolve_properties(None) is None
    assert resolve_properties({"A": 1}) == {"A": 1}


def test_explicit_properties_go_on_top_of_a_preset():
    assert with_preset("exact", {"PERFORMANCE_HINT": "THROUGHPUT"}) == {
        **EXACT_PROPERTIES,
        "PERFORMANCE_HINT": "THROUGHPUT",
    }
    assert with_preset("exact", {"KV_CACHE_PRECISION": "u8"})["KV_CACHE_PRECISION"] == "u8"
    assert with_preset(None, {}) is None and with_preset(None, {"A": "1"}) == {"A": "1"}


def test_tuned_properties_yield_to_a_user_who_sets_precision():
    tuned = {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "u8",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
    }
    assert layer_tuned(tuned, None) == tuned
    assert layer_tuned(tuned, {"PERFORMANCE_HINT": "LATENCY"}) == {**tuned, "PERFORMANCE_HINT": "LATENCY"}
    # Any precision key of the user's own replaces all the tuned ones (they were chosen together).
    assert layer_tuned(tuned, {"INFERENCE_PRECISION_HINT": "f32"}) == {"INFERENCE_PRECISION_HINT": "f32"}
    assert layer_tuned(tuned, dict(EXACT_PROPERTIES)) == EXACT_PROPERTIES
    assert layer_tuned(None, None) is None
    assert readable(tuned) == "compute=f32, kv=u8, dq_group=128"


@pytest.mark.parametrize("weights", ["int4", "int8", "Q4_1+Q8_0", "fp16", None])
def test_the_cpu_defaults_quantise_the_targets_keys_per_token_whatever_the_weights(weights):
    from xpuspec_plugins.cpu import CpuPlugin

    defaults = CpuPlugin().compile_properties("target", None, weights=weights)
    assert {key: defaults[key] for key in PER_TOKEN_KEYS} == PER_TOKEN_KEYS
    # The draft's cache changes no answer: it keeps the plugin's own key mode.
    assert KEY_QUANT_MODE not in CpuPlugin().compile_properties("draft", None, weights=weights)
    # The user's own mode wins (the plugin's per-channel keys: faster on some CPUs, not speculation-stable).
    mine = CpuPlugin().compile_properties("target", {KEY_QUANT_MODE: "BY_CHANNEL"}, weights=weights)
    assert mine[KEY_QUANT_MODE] == "BY_CHANNEL"
    assert readable({KEY_QUANT_MODE: "BY_TOKEN"}) == "keys=BY_TOKEN"


# Code from the demo pair's held-out files (xpuspec.models.demo.heldout: lines 41-48 of six standard-library
# modules). At main's former defaults (keys quantised per channel) the demo pair's speculative text
# differed from its target-only text on the glob prompt, and the target-only text of the bisect and csv
# prompts changed when they ran again among the others; with per-token key scales none did.
HELDOUT_CODE = [
    # bisect.py
    (
        "            else:\n"
        "                lo = mid + 1\n"
        "    else:\n"
        "        while lo < hi:\n"
        "            mid = (lo + hi) // 2\n"
        "            if x < key(a[mid]):\n"
        "                hi = mid\n"
        "            else:\n"
    ),
    # csv.py
    (
        "\n"
        "    def __init__(self):\n"
        "        if self.__class__ != Dialect:\n"
        "            self._valid = True\n"
        "        self._validate()\n"
        "\n"
        "    def _validate(self):\n"
        "        try:\n"
    ),
    # glob.py
    (
        "    zero or more directories and subdirectories.\n"
        '    """\n'
        '    sys.audit("glob.glob", pathname, recursive)\n'
        '    sys.audit("glob.glob/2", pathname, recursive, root_dir, dir_fd)\n'
        "    if root_dir is not None:\n"
        "        root_dir = os.fspath(root_dir)\n"
        "    else:\n"
        "        root_dir = pathname[:0]\n"
    ),
    # fnmatch.py
    (
        "        pat_str = str(pat, 'ISO-8859-1')\n"
        "        res_str = translate(pat_str)\n"
        "        res = bytes(res_str, 'ISO-8859-1')\n"
        "    else:\n"
        "        res = translate(pat)\n"
        "    return re.compile(res).match\n"
        "\n"
        "def filter(names, pat):\n"
    ),
    # queue.py
    (
        "        # releasing the conditions also acquires and releases mutex.\n"
        "        self.mutex = threading.Lock()\n"
        "\n"
        "        # Notify not_empty whenever an item is added to the queue; a\n"
        "        # thread waiting to get is notified then.\n"
        "        self.not_empty = threading.Condition(self.mutex)\n"
        "\n"
        "        # Notify not_full whenever an item is removed from the queue;\n"
    ),
    # sched.py
    (
        "    separates events if time and priority are equal.''')\n"
        "Event.action.__doc__ = ('''Executing the event means executing\n"
        "action(*argument, **kwargs)''')\n"
        "Event.argument.__doc__ = ('''argument is a sequence holding the positional\n"
        "arguments for the action.''')\n"
        "Event.kwargs.__doc__ = ('''kwargs is a dictionary holding the keyword\n"
        "arguments for the action.''')\n"
        "\n"
    ),
]
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def target_only():
    """The demo pair's target alone at the default properties, and its greedy tokens one request at a time."""
    from xpuspec import Pipeline
    from xpuspec.planning.agreement import greedy_token_ids

    pipe = Pipeline("demo", drafter="none", use_placement=False)
    assert pipe.target_runner.cache_tensors["key_cache.0"].get_element_type().get_type_name() == "u8"
    return pipe, greedy_token_ids(pipe, HELDOUT_CODE, MAX_TOKENS, ignore_eos=True)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_at_the_default_properties_drafting_changes_no_greedy_text(target_only, drafter):
    """Default properties (a u8 KV cache with per-token key scales): speculative greedy text equals
    target-only greedy text, one request at a time and all six in flight."""
    from xpuspec import Pipeline
    from xpuspec.planning.agreement import compare, greedy_token_ids

    _, reference = target_only
    speculative = Pipeline("demo", drafter=drafter, use_placement=False)
    for in_flight in (1, len(HELDOUT_CODE)):
        got = greedy_token_ids(speculative, HELDOUT_CODE, MAX_TOKENS, ignore_eos=True, in_flight=in_flight)
        assert compare(reference, got).all_same, (in_flight, compare(reference, got).describe())


def test_at_the_default_properties_a_request_sent_again_among_others_gets_the_same_text(target_only):
    """The same requests again, all six in flight, with their prompts' full blocks in the prefix cache
    (and prefills cut where the step's token budget falls): the same greedy text."""
    from xpuspec.planning.agreement import compare, greedy_token_ids

    pipe, reference = target_only
    again = greedy_token_ids(pipe, HELDOUT_CODE, MAX_TOKENS, ignore_eos=True, in_flight=len(HELDOUT_CODE))
    assert compare(reference, again).all_same, compare(reference, again).describe()
