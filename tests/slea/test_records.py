import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slea.records import SCHEMA_VERSION, RecordDecodeError, StepRecord, decode, encode

text = st.text(max_size=200)
int32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def step_records(draw, max_prompt=300):
    response_len = draw(st.integers(0, 64))
    return StepRecord(
        run_id=draw(text),
        task_id=draw(text),
        task_type=draw(text),
        env_name=draw(text),
        group_id=draw(text),
        episode_id=draw(text),
        step=draw(st.integers(0, 10_000)),
        anchor_obs=draw(text),
        anchor_cluster=draw(text),
        prompt_ids=np.array(draw(st.lists(int32, max_size=max_prompt)), dtype=np.int32),
        response_ids=np.array(draw(st.lists(int32, min_size=response_len, max_size=response_len)), dtype=np.int32),
        response_logprobs=np.array(
            draw(st.lists(st.floats(width=32, allow_nan=False), min_size=response_len, max_size=response_len)),
            dtype=np.float32,
        ),
        action=draw(text),
        action_valid=draw(st.booleans()),
        reward=draw(st.floats(allow_nan=False)),
        done=draw(st.booleans()),
        success=draw(st.booleans()),
        policy_version=draw(st.integers(0, 2**40)),
        library_version=draw(st.integers(-1, 2**40)),
        experience_ids=draw(st.lists(text, max_size=5)),
        step_budget=draw(st.integers(0, 1000)),
        with_experience=draw(st.booleans()),
        abandoned=draw(st.booleans()),
        teacher_prompt_ids=np.array(draw(st.lists(int32, max_size=max_prompt)), dtype=np.int32),
        created_at=draw(st.floats(0, 2e9)),
    )


@settings(max_examples=200, deadline=None)
@given(step_records())
def test_round_trip(record):
    decoded = decode(encode(record))
    assert decoded == record
    assert decoded.prompt_ids.dtype == np.dtype("<i4") and decoded.response_logprobs.dtype == np.dtype("<f4")


def test_empty_response_and_8k_prompt():
    rng = np.random.default_rng(0)
    record = StepRecord(
        "run", "t", "pick", "alfworld", "g", "e", 0, "obs", prompt_ids=rng.integers(0, 50_000, 8192, dtype=np.int32)
    )
    blob = encode(record)
    assert decode(blob) == record
    assert 8192 * 4 <= len(blob) < 8192 * 4 + 1024  # packed, not one msgpack int per token


def test_arrays_are_little_endian_on_the_wire():
    record = StepRecord("r", "t", "k", "e", "g", "ep", 0, "o", prompt_ids=np.array([1, 256], dtype=">i4"))
    payload = msgpack.unpackb(encode(record))
    assert payload["prompt_ids"] == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert payload["v"] == SCHEMA_VERSION


def test_teacher_prompt_round_trips_and_defaults_to_empty():
    teacher = np.array([5, 6, 7, 8], dtype=np.int32)
    record = StepRecord("r", "t", "k", "e", "g", "ep", 0, "o", with_experience=False, teacher_prompt_ids=teacher)
    decoded = decode(encode(record))
    assert decoded == record and decoded.teacher_prompt_ids.tolist() == [5, 6, 7, 8]
    assert len(decode(encode(StepRecord("r", "t", "k", "e", "g", "ep", 0, "o"))).teacher_prompt_ids) == 0


def test_schema_v1_records_still_decode_without_a_teacher_prompt():
    v1 = {k: v for k, v in _valid_payload().items() if k != "teacher_prompt_ids"} | {"v": 1}
    decoded = decode(msgpack.packb(v1))
    assert decoded.teacher_prompt_ids.dtype == np.dtype("<i4") and len(decoded.teacher_prompt_ids) == 0
    with pytest.raises(RecordDecodeError, match="unknown fields.*teacher_prompt_ids"):
        decode(msgpack.packb({**_valid_payload(), "v": 1}))  # a v1 payload cannot carry a v2 field


def test_length_mismatch_is_refused_at_encode():
    record = StepRecord(
        "r",
        "t",
        "k",
        "e",
        "g",
        "ep",
        0,
        "o",
        response_ids=np.array([1, 2], dtype=np.int32),
        response_logprobs=np.array([-0.1], dtype=np.float32),
    )
    with pytest.raises(ValueError, match="2 response ids but 1 log-probs"):
        encode(record)


def _valid_payload() -> dict:
    return msgpack.unpackb(encode(StepRecord("r", "t", "k", "e", "g", "ep", 0, "o")))


@pytest.mark.parametrize(
    "blob, message",
    [
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2, 3]), "not a map"),
        (msgpack.packb({**_valid_payload(), "v": 99}), "unknown StepRecord schema version 99"),
        (msgpack.packb({k: v for k, v in _valid_payload().items() if k != "v"}), "schema version None"),
        (msgpack.packb({k: v for k, v in _valid_payload().items() if k != "episode_id"}), "lacks required fields"),
        (msgpack.packb({**_valid_payload(), "surprise": 1}), "unknown fields"),
        (msgpack.packb({**_valid_payload(), "prompt_ids": b"\x00\x01\x02"}), "not a packed int32"),
        (msgpack.packb({**_valid_payload(), "step": "three"}), "field 'step' has type str"),
        (msgpack.packb({**_valid_payload(), "done": 1}), "field 'done' has type int"),
        (msgpack.packb({**_valid_payload(), "response_ids": b"\x00" * 8}), "differ in length"),
        (msgpack.packb({**_valid_payload(), "experience_ids": [1]}), "list of strings"),
    ],
)
def test_malformed_payloads_raise_one_error_type(blob, message):
    with pytest.raises(RecordDecodeError, match=message):
        decode(blob)
