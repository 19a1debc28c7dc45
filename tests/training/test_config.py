"""TrainConfig: bad values are refused naming the field, and to_dict / from_dict round-trip and
refuse unknown keys."""

from __future__ import annotations

import dataclasses

import pytest

from addnorm.training.config import TrainConfig


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("max_steps", 0, ValueError),
        ("max_steps", 2.5, TypeError),
        ("max_minutes", 0.0, ValueError),
        ("batch_size", -4, ValueError),
        ("lr", 0.0, ValueError),
        ("schedule", "linear", ValueError),
        ("grad_clip", -1.0, ValueError),
        ("ema_decay", 1.0, ValueError),
        ("bf16", "yes", TypeError),
        ("seed", -1, ValueError),
        ("keep_best", 1, TypeError),
        ("eval_every", 0, ValueError),
        ("patience", 0, ValueError),
    ],
)
def test_train_config_rejects_bad_values_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        TrainConfig(**{field: value})


def test_noam_schedule_needs_a_warmup():
    with pytest.raises(ValueError, match="warmup"):
        TrainConfig(schedule="noam", warmup=0)


def test_train_config_from_dict_rejects_unknown_fields_naming_the_known_ones():
    assert TrainConfig.from_dict(TrainConfig(lr=0.5).to_dict()) == TrainConfig(lr=0.5)
    with pytest.raises(ValueError, match=r"unknown TrainConfig keys \['learning_rate'\]") as err:
        TrainConfig.from_dict({"learning_rate": 0.1})
    known = sorted(f.name for f in dataclasses.fields(TrainConfig))
    assert f"known keys are {known}" in str(err.value)
    with pytest.raises(TypeError, match="must be a dict, got list"):
        TrainConfig.from_dict([("lr", 0.1)])
