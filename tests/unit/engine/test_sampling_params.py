"""Sampling parameters (localserve/engine/sampling_params.py): their bounds, named in every
error, and when sampling is greedy."""

from __future__ import annotations

import msgspec
import pytest

from localserve.engine.sampling_params import SamplingParams, sampling_params
from localserve.protocol.frames import Chat, Message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_k", -1),
        ("min_p", 1.5),
        ("repeat_penalty", 0.0),
        ("repeat_last_n", 5000),
        ("seed", -1),
        ("seed", 1 << 32),
        ("stop", ("",)),
        ("stop", tuple(f"s{i}" for i in range(17))),
        ("stop", ("x" * 257,)),
        ("top_k", 1 << 31),
        ("top_k", 10**40),
        ("max_tokens", 10**40),
        ("repeat_penalty", 5e-324),
        ("repeat_penalty", 0.00999),
        ("temperature", float("inf")),
        ("temperature", float("nan")),
        ("top_p", float("nan")),
    ],
)
def test_invalid_sampling_param_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}: "):
        SamplingParams(**{field: value})


def test_sampling_params_boundary_values_are_accepted():
    SamplingParams(max_tokens=1, temperature=0, top_p=1.0, seed=(1 << 32) - 1, stop=("x",) * 16)
    SamplingParams(
        temperature=5e-324,
        top_p=5e-324,
        min_p=5e-324,
        top_k=(1 << 31) - 1,
        repeat_penalty=0.01,
        stop=("x" * 256,),
    )


def test_a_tiny_temperature_is_greedy():
    assert SamplingParams(temperature=1e-320).is_greedy


def test_invalid_sampling_param_in_json_is_a_validation_error_naming_the_field():
    with pytest.raises(msgspec.ValidationError, match="temperature"):
        msgspec.json.decode(b'{"temperature": -1}', type=SamplingParams)


def test_unknown_sampling_param_is_rejected():
    with pytest.raises(msgspec.ValidationError, match="temprature"):
        msgspec.json.decode(b'{"temprature": 0}', type=SamplingParams)


def test_temperature_zero_without_penalty_is_greedy():
    assert SamplingParams(temperature=0).is_greedy


@pytest.mark.parametrize(
    "params", [{"temperature": 0.7}, {"temperature": 0, "repeat_penalty": 1.1}]
)
def test_sampling_with_temperature_or_penalty_is_not_greedy(params):
    assert not SamplingParams(**params).is_greedy


def test_one_sampling_definition_behind_both_protocols():
    chat = Chat(
        id="a", messages=[Message("user", "hi")], temperature=0.1, stop=["x"], frequency_penalty=0.5
    )
    params = sampling_params(chat)
    assert (params.temperature, params.stop, params.frequency_penalty) == (0.1, ("x",), 0.5)
    assert params.has_penalties and not params.is_greedy
    with pytest.raises(ValueError, match="presence_penalty"):
        sampling_params(Chat(id="a", messages=[], presence_penalty=3))
