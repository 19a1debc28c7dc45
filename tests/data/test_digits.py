"""scikit-learn's digits as the DiT task sees them: fixed stratified splits, the [-1, 1]
scale and back, and a batch source whose draws are its data order (exact resume)."""

from __future__ import annotations

import torch

from addnorm.data.batches import DigitBatches
from addnorm.data.digits import load_digits, to_model_scale, to_pixel_scale


def test_the_splits_partition_the_1797_digits_with_every_class_in_both():
    train, test = load_digits("train"), load_digits("test")
    assert len(train) + len(test) == 1797  # sklearn.datasets.load_digits' size
    assert set(train.labels.tolist()) == set(test.labels.tolist()) == set(range(10))
    share = train.labels.bincount() / (train.labels.bincount() + test.labels.bincount())
    # stratified 80 / 20: each class (~180 images) rounds to within 1/(2 * 174) = 0.003
    # (measured 0.0023), a fixed split with no rounding of floats that could move it.
    assert torch.all((share - 0.8).abs() < 0.01)
    flat = {tuple(p.flatten().tolist()) for p in train.pixels}
    # ~no overlap: a count over fixed data (0 measured), not a rounding bound.
    assert sum(tuple(p.flatten().tolist()) in flat for p in test.pixels) < 5


def test_pixels_map_to_minus_one_one_and_back():
    pixels = torch.tensor([0.0, 8.0, 16.0])
    assert torch.equal(to_model_scale(pixels), torch.tensor([-1.0, 0.0, 1.0]))
    assert torch.equal(to_pixel_scale(to_model_scale(pixels)), pixels)
    assert torch.equal(to_pixel_scale(torch.tensor([-3.0, 2.0])), torch.tensor([0.0, 16.0]))
    images = load_digits("test").images()
    assert images.shape[1:] == (1, 8, 8) and images.min() >= -1 and images.max() <= 1


def test_a_restored_batch_source_continues_with_the_same_images_timesteps_and_noise():
    first = DigitBatches(batch_size=5, n_steps=1000, seed=3)
    first.next_batch()
    state = first.state_dict()
    expected = first.next_batch()
    second = DigitBatches(batch_size=5, n_steps=1000, seed=99)
    second.load_state_dict(state)
    got = second.next_batch()
    for key in ("images", "labels", "t", "noise"):
        assert torch.equal(got[key], expected[key]), key
    assert expected["t"].min() >= 0 and expected["t"].max() < 1000
