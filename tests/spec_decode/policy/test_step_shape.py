"""StepShape: the target step's shape, and the padding that keeps it while shrinking does not pay."""

from __future__ import annotations

from xpuspec.core.chunks import SequenceChunk
from xpuspec.spec_decode.policy.cost_model import CostModel
from xpuspec.spec_decode.policy.step_shape import StepShape, decode_sequences, step_tokens


def _cost_model() -> CostModel:
    model = CostModel()
    for tokens in range(1, 6):  # 1 ms and 0.1 ms more per verified token
        model.calibrate_target(1, tokens, 1e-3 + 1e-4 * (tokens - 1))
    model.calibrate_shape_change(1e-3)  # a change of shape costs a whole step
    return model


def _decode(tokens: int, past: int = 40) -> SequenceChunk:
    return SequenceChunk([7] * tokens, past, list(range(8)), num_logits=tokens, sequence_id="a")


def test_a_smaller_decode_step_is_padded_to_the_last_shape_until_shrinking_pays() -> None:
    shape, model = StepShape(can_pad=True, max_model_len=128), _cost_model()
    assert shape.record([_decode(5)]) == ((5, 1), False)
    paddings = []
    for _ in range(7):
        chunks = [_decode(1)]
        shape.keep(chunks, model)
        paddings.append(chunks[0].padding)
        assert shape.record(chunks)[0] == ((5 if chunks[0].padding else 1), 1)
    # 0.4 ms of padding a step pays for two 1 ms changes after 6 steps (CostModel.shrink_pays).
    assert paddings == [4] * 5 + [0, 0]


def test_no_padding_past_the_context_a_prefill_or_a_target_without_it() -> None:
    model = _cost_model()
    for can_pad, last, chunk in (
        (False, _decode(5), _decode(1)),  # the target runs no padding tokens
        (True, _decode(5), _decode(1, past=125)),  # 126 + 4 padding > max_model_len 128
        (True, _decode(5), SequenceChunk([7] * 3, 0, [0], num_logits=1)),  # a prefill: no decode shape
    ):
        shape = StepShape(can_pad, max_model_len=128)
        shape.record([last])
        chunks = [chunk]
        shape.keep(chunks, model)
        assert chunks[0].padding == 0


def test_shapes_count_padding_and_decodes() -> None:
    padded = SequenceChunk([1, 2], 10, [0], num_logits=2, padding=3)
    assert step_tokens([padded, _decode(1)]) == 6
    assert decode_sequences([padded, _decode(1)]) == 2
    assert decode_sequences([SequenceChunk([1, 2], 0, [0], num_logits=1)]) is None


def test_a_step_that_does_not_hold_the_shape_shrinks_at_once() -> None:
    """While adaptive drafting is off at a batch (DraftingPayoff), steps do not carry the padding of
    the drafting steps before them."""
    shape, model = StepShape(can_pad=True, max_model_len=128), _cost_model()
    shape.record([_decode(5)])
    chunks = [_decode(1)]
    shape.keep(chunks, model, hold=False)
    assert chunks[0].padding == 0
    assert shape.record(chunks) == ((1, 1), True)


def test_a_smaller_tree_is_padded_to_the_last_shape_like_a_chain() -> None:
    """An automatic tree of fewer nodes than the last step's holds its shape with padding tokens
    (roots of their own in the runner's tree mask), as a shorter chain does."""
    shape, model = StepShape(can_pad=True, max_model_len=128), _cost_model()
    shape.record([_decode(5)])
    tree = SequenceChunk([7] * 3, 40, list(range(8)), num_logits=3, tree_parents=[-1, 0, 0])
    chunks = [tree]
    shape.keep(chunks, model)
    assert chunks[0].padding == 2
    assert chunks[0].tree_parents == [-1, 0, 0]
    assert shape.record(chunks) == ((5, 1), False)


def test_one_token_steps_on_a_decode_lane_are_not_padded_and_change_no_shape() -> None:
    """A target with a decode lane runs steps of one token per sequence on a copy of its own: they
    are never padded, and the next verification is compared with the main copy's last step."""
    shape, model = StepShape(can_pad=True, max_model_len=128, decode_lane=True), _cost_model()
    assert shape.record([_decode(5)]) == ((5, 1), False)
    for _ in range(3):
        chunks = [_decode(1)]
        shape.keep(chunks, model)
        assert chunks[0].padding == 0
        assert shape.record(chunks)[1] is False  # the lane's own shape holds
    assert shape.last == (5, 1)
    assert shape.record([_decode(5)]) == ((5, 1), False)  # back on the main copy: no change
    smaller = [_decode(3)]
    shape.keep(smaller, model)  # a shorter verification still holds the main copy's shape
    assert smaller[0].padding == 2
    assert shape.record([_decode(4)]) == ((4, 1), True)
    shape.forget()
    assert shape.last is None and shape.last_one_token is None


def test_without_a_decode_lane_one_token_steps_change_the_shape() -> None:
    shape = StepShape(can_pad=False, max_model_len=128)
    shape.record([_decode(5)])
    assert shape.record([_decode(1)]) == ((1, 1), True)
    assert shape.record([_decode(5)]) == ((5, 1), True)
