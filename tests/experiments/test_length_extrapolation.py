"""length-extrapolation: the quick run is too short to learn the copy task, so its verdict is
"undecided", and it checks the mechanism: a learned table's rows past the training length
never receive a gradient, and the sinusoidal and rotary models run at lengths never seen."""

import math

from addnorm.experiments import length_extrapolation


def test_learned_rows_past_the_training_length_stay_at_their_initialisation():
    outcome = length_extrapolation.run(quick=True)
    numbers = outcome.numbers
    assert numbers["learned_rows_past_training_max_change"] == 0.0
    for encoding in length_extrapolation.ENCODINGS:
        assert all(0.0 <= a <= 1.0 and math.isfinite(a) for a in numbers["accuracy"][encoding])
    assert max(numbers["test_n"]) > numbers["train_max_n"]
    # 10 steps learn nothing: accuracy at the trained lengths is at chance (1/16; measured
    # 0.04-0.05), far below WORKS = 0.5, so nothing past them can be compared.
    assert max(numbers["accuracy_at_trained_lengths"].values()) < length_extrapolation.WORKS
    assert outcome.supported is None and "800 steps" in outcome.undecided_because


def test_copy_batch_is_bos_symbols_sep_symbols():
    import torch

    ids = length_extrapolation.copy_batch(torch.Generator().manual_seed(0), 3)
    assert ids.shape == (length_extrapolation.BATCH, 8)
    assert (ids[:, 0] == 1).all() and (ids[:, 4] == length_extrapolation.SEP).all()
    assert (ids[:, 1:4] == ids[:, 5:]).all()
