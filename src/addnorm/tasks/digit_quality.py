"""How good are generated digits? A judge trained on real ones, and three numbers.

- ``class_agreement``: a classifier trained on the real train split (an RBF support-vector
  machine from scikit-learn; its held-out accuracy on the test split is reported as
  ``judge_test_accuracy`` and must be >= 0.95 for the figure to mean anything) labels the
  samples generated for each class; the share it puts in the requested class is the headline.
- ``class_agreement_independent``: the same share by a second judge of another kind, a
  3-nearest-neighbour vote among the real train digits (``independent_test_accuracy`` on the
  test split), so that a sample the SVM accepts for a quirk of its decision boundary, and no
  real digit resembles, does not count twice.
- ``frechet_distance``: the Fréchet distance between Gaussians fitted to generated and to real
  test digits in a 16-dimensional PCA space of the train split (FID's formula on small
  features): mode collapse or blur raise it. ``frechet_distance_real`` is the same for as many
  real train digits as there are samples, the floor that sampling alone gives.
- ``nearest_train_distance``: the mean L2 distance (0..16 pixel scale) from each sample to its
  nearest train image, beside ``nearest_train_distance_real``, the same for real test
  images. Far below the real figure means the model copies its training set (memorisation).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from addnorm.data.digits import MAX_PIXEL, load_digits
from addnorm.tasks.image_quality import frechet_distance as _frechet

__all__ = ["DigitJudge", "digit_judge"]

_PCA_DIMS = 16


def _flat(pixels: torch.Tensor) -> np.ndarray:
    """(N, 8, 8) pixels on the 0..16 scale as (N, 64) float64 in [0, 1]."""
    return pixels.reshape(pixels.shape[0], -1).double().numpy() / MAX_PIXEL


def _nearest_distance(queries: np.ndarray, references: np.ndarray) -> float:
    """Mean over queries of the L2 distance to the nearest reference (pixel scale 0..16)."""
    q = torch.from_numpy(queries) * MAX_PIXEL
    r = torch.from_numpy(references) * MAX_PIXEL
    return float(torch.cdist(q, r).min(dim=1).values.mean())


@dataclass
class DigitJudge:
    """The classifier and features every score uses, fitted once on the real digits."""

    classifier: object
    independent: object
    pca: object
    test_accuracy: float
    independent_test_accuracy: float
    train_flat: np.ndarray
    test_flat: np.ndarray

    def _real_like(self, n: int) -> np.ndarray:
        """``n`` train digits (a fixed draw): the real counterpart of ``n`` samples."""
        pool = len(self.train_flat)
        return self.train_flat[np.random.default_rng(0).choice(pool, size=n, replace=n > pool)]

    def predict(self, pixels: torch.Tensor) -> np.ndarray:
        """Class ids (N,) for (N, 8, 8) digits on the 0..16 scale."""
        return self.classifier.predict(_flat(pixels))  # type: ignore[attr-defined]

    def score(self, pixels: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """The figures of the module docstring for samples (N, 8, 8) generated for ``labels``.

        Shapes:
            pixels: (N, 8, 8) on the 0..16 scale; labels: (N,) the requested classes
        """
        if pixels.ndim != 3 or pixels.shape[0] != labels.shape[0] or pixels.shape[0] < 2:
            raise ValueError(
                f"pixels must be (N, 8, 8) with N = len(labels) >= 2, got {tuple(pixels.shape)} "
                f"and {tuple(labels.shape)} labels"
            )
        flat = _flat(pixels)
        predicted = self.classifier.predict(flat)  # type: ignore[attr-defined]
        agree = predicted == labels.numpy()
        per_class = {
            f"class_agreement_{c}": float(agree[labels.numpy() == c].mean())
            for c in sorted(set(labels.tolist()))
        }
        independent = self.independent.predict(flat)  # type: ignore[attr-defined]
        features = self.pca.transform  # type: ignore[attr-defined]
        return {
            "class_agreement": float(agree.mean()),
            **per_class,
            "judge_test_accuracy": self.test_accuracy,
            "class_agreement_independent": float((independent == labels.numpy()).mean()),
            "independent_test_accuracy": self.independent_test_accuracy,
            "frechet_distance": _frechet(features(flat), features(self.test_flat)),
            "frechet_distance_real": _frechet(features(self._real_like(len(flat))),
                                              features(self.test_flat)),
            "nearest_train_distance": _nearest_distance(flat, self.train_flat),
            "nearest_train_distance_real": _nearest_distance(self.test_flat, self.train_flat),
        }


@lru_cache(maxsize=1)
def digit_judge() -> DigitJudge:
    """The judge, fitted on the train split (well under a second); cached per process."""
    from sklearn.decomposition import PCA
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.svm import SVC

    train, test = load_digits("train"), load_digits("test")
    train_flat, test_flat = _flat(train.pixels), _flat(test.pixels)
    labels, test_labels = train.labels.numpy(), test.labels.numpy()
    classifier = SVC(C=10.0, gamma=0.05).fit(train_flat, labels)
    accuracy = float((classifier.predict(test_flat) == test_labels).mean())
    independent = KNeighborsClassifier(n_neighbors=3).fit(train_flat, labels)
    independent_accuracy = float((independent.predict(test_flat) == test_labels).mean())
    pca = PCA(n_components=_PCA_DIMS, random_state=0).fit(train_flat)
    return DigitJudge(classifier, independent, pca, accuracy, independent_accuracy, train_flat,
                      test_flat)
