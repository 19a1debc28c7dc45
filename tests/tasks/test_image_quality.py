"""The figures a DiT on a user's images is scored with (addnorm.tasks.image_quality).

Provenance: the Fréchet distance of a set and its translate by c is |c|^2 (equal covariances:
the trace term vanishes), and of a set and itself 0; a manifold holds its own points
(coverage 1) and not points farther than any radius (0), and the chunked searches equal a
brute-force ``torch.cdist`` over every pair; the feature space's purpose, ranking real images
above blurred and noisy ones, is checked on crops of scikit-learn's two sample photos (real
images that ship with the install), with the same train images blurred (Pillow's Gaussian
blur) or noised as the degraded sets; the judge's agreement on real held-out images is its
held-out accuracy (the same predictions, an identity), which is itself recounted from the
judge's predictions on the held-out images; the too-weak rule (judge_verdict: held-out
accuracy >= 0.8 and a one-sided binomial test against the largest class's share at p < 0.01)
is restated with scipy's binomtest, and checked to fire on noise images with random labels
(a judge of them is at chance) and not on the photo crops.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter, ImageOps

from addnorm.tasks.image_quality import (
    MIN_JUDGE_ACCURACY,
    ImageJudge,
    RandomFeatures,
    frechet_distance,
    judge_verdict,
    manifold_coverage,
    nearest_distance,
)


def photo_crops(per_class: int = 60, size: int = 16, seed: int = 0):
    """Random square crops (32 to 80 pixels a side) of scikit-learn's two sample photos,
    resized to ``size``: uint8 (N, 3, S, S) and labels (N,)."""
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(seed)
    images, labels = [], []
    for label, photo in enumerate(load_sample_images().images):
        height, width = photo.shape[:2]
        for _ in range(per_class):
            side = int(rng.integers(32, 81))
            top, left = int(rng.integers(0, height - side)), int(rng.integers(0, width - side))
            crop = Image.fromarray(photo[top : top + side, left : left + side])
            images.append(np.asarray(ImageOps.fit(crop, (size, size),
                                                  method=Image.Resampling.BICUBIC)))
            labels.append(label)
    array = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()
    return array, torch.tensor(labels)


@pytest.fixture(scope="module")
def judged():
    images, labels = photo_crops()
    held = torch.arange(len(labels)) % 4 == 0  # a quarter held out, both classes
    judge = ImageJudge.fit(images[~held], labels[~held], images[held], labels[held],
                           ("china", "flower"))
    return judge, images[~held], labels[~held], images[held], labels[held]


def _blur(pixels: torch.Tensor, radius: float) -> torch.Tensor:
    out = [np.asarray(Image.fromarray(p.permute(1, 2, 0).numpy()).filter(
        ImageFilter.GaussianBlur(radius))) for p in pixels]
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()


def _noise(pixels: torch.Tensor, sigma: float, seed: int = 0) -> torch.Tensor:
    noise = torch.randn(pixels.shape, generator=torch.Generator().manual_seed(seed)) * sigma
    return (pixels.float() + 255 * noise).round().clamp(0, 255).to(torch.uint8)


def test_the_frechet_distance_of_a_translate_is_the_squared_shift_and_of_itself_zero():
    a = np.random.default_rng(0).normal(size=(200, 5)) @ np.diag([1.0, 2.0, 0.5, 3.0, 1.0])
    c = np.array([0.3, -1.0, 2.0, 0.0, 0.5])
    assert frechet_distance(a, a + c) == pytest.approx(float(c @ c), abs=1e-6)
    assert frechet_distance(a, a) == pytest.approx(0.0, abs=1e-6)


def test_coverage_and_nearest_distance_equal_brute_force_and_their_identities():
    rng = np.random.default_rng(1)
    refs, queries = rng.normal(size=(700, 4)), rng.normal(size=(300, 4)) * 1.5
    assert manifold_coverage(refs, refs) == 1.0
    assert manifold_coverage(refs + 100.0, refs) == 0.0
    d = torch.cdist(torch.from_numpy(refs), torch.from_numpy(refs))
    radii = d.sort(dim=1).values[:, 3]  # the 3rd nearest other point (index 0 is itself)
    inside = (torch.cdist(torch.from_numpy(queries), torch.from_numpy(refs)) <= radii).any(1)
    assert manifold_coverage(queries, refs) == float(inside.double().mean())
    q, r = torch.from_numpy(queries).float(), torch.from_numpy(refs).float()
    brute = float(torch.cdist(q, r).min(dim=1).values.double().mean())
    assert nearest_distance(q, r) == pytest.approx(brute, rel=1e-6)  # float32 sums


def test_the_features_are_fixed_by_their_seed():
    images = torch.rand(5, 3, 16, 16)
    np.testing.assert_array_equal(RandomFeatures(3)(images), RandomFeatures(3)(images))
    assert RandomFeatures(3)(images).shape == (5, RandomFeatures(3).dims) == (5, 166)
    assert RandomFeatures(1)(torch.rand(2, 1, 4, 4)).shape == (2, 162)


@pytest.mark.parametrize(("degrade", "name"), [
    (lambda x: _blur(x, 1.2), "blurred"), (lambda x: _noise(x, 0.1), "noised"),
])
def test_the_feature_space_ranks_real_images_above_blurred_and_noisy_ones(judged, degrade, name):
    """The same 30 train images, as they are and degraded, against the held-out ones: real
    scores the lower Fréchet distance (measured on three draws: blurred +4.3 to +6.1 over
    real's 22, noised +12 to +17)."""
    judge, train, _, _, _ = judged
    project = judge.pca.transform  # type: ignore[attr-defined]
    held = project(judge.held)

    def distance(x):
        return frechet_distance(project(judge.standardised(x)), held)

    for seed in range(3):
        pick = np.random.default_rng(seed).choice(len(train), 30, replace=False)
        draw = train[torch.from_numpy(pick)]
        assert distance(draw) < distance(degrade(draw)), (name, seed)


def test_noisy_images_fall_outside_the_real_manifold_more_often(judged):
    """Precision (Kynkäänniemi et al.'s share of points inside the train images' manifold):
    the held-out images score higher than the same images noised (measured 0.97 and 0.73)
    and than uniform noise (0)."""
    judge, _, _, held, _ = judged

    def precision(x):
        return manifold_coverage(judge.standardised(x), judge.reference)

    noise = torch.randint(0, 256, held.shape, generator=torch.Generator().manual_seed(0),
                          dtype=torch.uint8)
    assert precision(held) > precision(_noise(held, 0.1)) > precision(noise) == 0.0


def test_real_held_out_images_score_as_real_and_the_judge_agrees_as_accurately_as_it_tests(
    judged
):
    judge, _, _, held, held_labels = judged
    assert judge.test_accuracy is not None and judge.test_accuracy >= 0.9  # measured 0.98
    scores = judge.score(held, held_labels)
    assert scores["class_agreement"] == judge.test_accuracy  # the same predictions
    assert scores["judge_test_accuracy"] == judge.test_accuracy
    assert scores["judge_trusted"] == 1.0
    assert scores["precision"] == scores["precision_real"]  # the held-out images themselves
    assert scores["nearest_train_distance"] == scores["nearest_train_distance_real"]
    assert set(scores) >= {"class_agreement_china", "class_agreement_flower", "recall",
                           "recall_real", "frechet_distance", "frechet_distance_real"}


def test_a_judge_of_one_class_scores_without_classes(judged):
    _, train, _, held, _ = judged
    judge = ImageJudge.fit(train[:20], torch.zeros(20, dtype=torch.long), held[:6],
                           torch.zeros(6, dtype=torch.long), ("all",))
    scores = judge.score(held[:6], torch.zeros(6, dtype=torch.long))
    assert "class_agreement" not in scores and 0.0 <= scores["precision"] <= 1.0
    with pytest.raises(ValueError, match="one class has no judge"):
        judge.predict(held[:2])
    with pytest.raises(ValueError, match="at least 2 train and 2 held-out images"):
        ImageJudge.fit(train[:5], torch.zeros(5, dtype=torch.long), held[:1],
                       torch.zeros(1, dtype=torch.long), ("all",))


def test_the_judges_held_out_accuracy_is_recounted_from_its_predictions(judged):
    judge, _, _, held, held_labels = judged
    hits = judge.predict(held) == held_labels.numpy()  # held out: never fitted on
    assert judge.test_accuracy == hits.mean()
    assert judge.judge_space in ("pixels", "features") and judge.verdict is None


def test_the_too_weak_rule_is_a_floor_and_a_binomial_test_against_the_largest_class():
    from scipy.stats import binomtest

    balanced = np.arange(10) % 2  # chance 0.5
    # 9 of 10: above the floor, but p = P(X >= 9 | 10, 0.5) = 11/1024 > 0.01: too few images
    assert binomtest(9, 10, 0.5, alternative="greater").pvalue == 11 / 1024
    assert "not clearly above chance with 10 held-out images" in judge_verdict(0.9, balanced)
    assert judge_verdict(1.0, balanced) is None  # p = 1/1024
    many = np.arange(100) % 10  # chance 0.1
    assert judge_verdict(MIN_JUDGE_ACCURACY, many) is None
    assert f"below {MIN_JUDGE_ACCURACY:g}" in judge_verdict(0.79, many)
    skewed = np.array([0] * 90 + [1] * 10)  # always naming class 0 scores 0.9
    assert judge_verdict(0.9, skewed) is not None and judge_verdict(0.98, skewed) is None


def test_a_judge_of_noise_with_random_labels_is_too_weak_and_gives_no_agreement():
    generator = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (200, 3, 8, 8), generator=generator, dtype=torch.uint8)
    labels = torch.randint(0, 4, (200,), generator=generator)
    judge = ImageJudge.fit(noise[:150], labels[:150], noise[150:], labels[150:],
                           ("a", "b", "c", "d"))
    assert judge.verdict is not None and judge.verdict.startswith("class agreement not judged")
    scores = judge.score(noise[150:], labels[150:])
    assert scores["judge_trusted"] == 0.0 and scores["judge_test_accuracy"] < 0.5
    assert not any(name.startswith("class_agreement") for name in scores)
