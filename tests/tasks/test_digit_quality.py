"""The judge of generated digits, checked on inputs whose answers are known: real held-out
digits (agreement = the classifier's accuracy, Fréchet distance 0 against themselves),
copies of training images (nearest-train distance 0: memorisation shows) and noise
(agreement near chance)."""

from __future__ import annotations

import torch

from addnorm.data.digits import load_digits
from addnorm.tasks.digit_quality import digit_judge


def test_the_judge_classifies_held_out_real_digits_well_enough_to_judge():
    judge = digit_judge()
    # A judge wrong on more than 1 digit in 20 could not tell a 0.95 class agreement from
    # its own errors; measured 0.989 on the 359 held-out digits.
    assert judge.test_accuracy >= 0.95
    test = load_digits("test")
    scores = judge.score(test.pixels, test.labels)
    assert scores["class_agreement"] == judge.test_accuracy
    # The second judge, by definition the same share on the same digits; 3-NN measured 0.989.
    assert judge.independent_test_accuracy >= 0.95
    assert scores["class_agreement_independent"] == judge.independent_test_accuracy
    # The same set as the reference statistics: float64 sqrtm of a 64 x 64 covariance leaves
    # ~1e-14 (measured -5e-15), so 1e-8 is rounding with room, and any real gap is >= 0.05.
    assert scores["frechet_distance"] < 1e-8
    assert scores["nearest_train_distance"] == scores["nearest_train_distance_real"]


def test_copied_training_images_show_memorisation():
    train = load_digits("train")
    scores = digit_judge().score(train.pixels[:200], train.labels[:200])
    assert scores["nearest_train_distance"] == 0.0
    # each copy is its own nearest neighbour (distance 0), so the 3-NN vote is rarely fooled
    assert scores["class_agreement_independent"] > 0.95  # measured 1.0
    assert scores["nearest_train_distance_real"] > 10.0  # measured 17.0


def test_noise_gets_chance_agreement_and_a_large_frechet_distance():
    noise = torch.rand(300, 8, 8, generator=torch.Generator().manual_seed(0)) * 16
    scores = digit_judge().score(noise, torch.arange(300) % 10)
    assert scores["class_agreement"] < 0.3  # measured 0.12; chance 0.1, binomial sd 0.017
    assert scores["class_agreement_independent"] < 0.3  # chance 0.1 likewise
    assert scores["frechet_distance"] > 10 * scores["frechet_distance_real"]  # 2.30 vs 0.086
