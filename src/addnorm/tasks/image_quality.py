"""How good are generated images of a user's data? Figures computed against the user's own
images, in a feature space that needs no download.

The feature space (:class:`RandomFeatures`): a fixed convolutional network with random
weights (seeded, never trained, so the same in every run and on every machine): three 3 x 3
convolutions with ReLU, the first with zero-mean filters (edge and texture detectors that
ignore the local brightness), average pooling by 2 between them; each layer's responses
averaged over the image, beside each channel's mean and standard deviation: 2C + 160
numbers an image. Features of randomly initialised networks are a known stand-in for
ImageNet-trained ones on data unlike ImageNet (Naeem et al., 2020, "Reliable Fidelity and
Diversity Metrics for Generative Models", random-initialised embeddings). Why not the pixels
themselves, as the digits' judge does: on crops of real photos the pixels' PCA space ranks
degraded images wrongly. Measured on 16 x 16 crops of scikit-learn's two sample photos (90
train, 30 held out; the Fréchet distance of 30 train images to the held-out ones, against the
same 30 degraded, over three draws): a Gaussian blur of radius 1.2 lowers the pixel-space
distance by 11-25% (blurred looks better than real) and noise of standard deviation 0.1 moves
it by -7% to +6%, while in this space the blur raises it by 4.3-6.1 and the noise by 12-17
(over about 22 for the real images); ``tests/tasks/test_image_quality.py`` checks this
ranking. Milder degradations are not told apart reliably with 30 images (noise of 0.05 scored
below the real images on all three draws). Each feature is standardised by its mean and
spread over the train images.

The figures (``ImageJudge.score``):

- ``frechet_distance``: FID's formula between Gaussians fitted to the samples' and the
  held-out images' features, in a ``PCA_DIMS``-dimensional PCA space of the train images'
  standardised features; ``frechet_distance_real``, the same for as many train images as
  there are samples (all of them, if fewer): the floor that finite samples give.
- ``precision`` and ``recall`` (Kynkäänniemi et al., 2019, "Improved Precision and Recall
  Metric for Assessing Generative Models", k = 3, in the standardised features): the share
  of samples inside the train images' k-nearest-neighbour manifold (do the samples look like
  the data?) and the share of held-out images inside the samples' (do the samples cover the
  data?). ``precision_real`` and ``recall_real``: the same with held-out images in place of
  the samples (for recall, as many train images as samples in place of the samples): what
  real images score. ``precision`` is the headline of a one-class (unconditional) run.
  Precision sees noise (0.73 for the held-out photo crops above noised by 0.1, against 0.97)
  but not blur (1.0 blurred by 1.2): the Fréchet distance is the figure that sees both.
- ``nearest_train_distance``: the mean L2 distance (pixels on [0, 1], over every channel and
  pixel) from each sample to its nearest train image; ``nearest_train_distance_real``, the
  same for the held-out images. Far below the real figure means the model copies its training
  set.
- Where there are classes, ``class_agreement``: the share of samples that a judge puts in
  the class they were generated for (and ``class_agreement_<name>`` per class). The judge is
  an RBF support-vector machine (C = 10, gamma "scale") fitted on the train images, in one of
  two spaces, whichever scores better in a ``CV_FOLDS``-fold cross-validation on the train
  images (ties: the pixels): the pixels on [0, 1] (images of at most ``PIXEL_JUDGE_MAX``
  numbers; kernels over larger pixel vectors cost too much) or the standardised features
  above (``judge_space`` says which; docs/image-judges.json measures both on real folders).
  ``judge_test_accuracy`` is its accuracy on the held-out images, a set it never saw, without
  which the agreement means little: a judge that cannot tell the real classes apart cannot
  tell the samples'. ``judge_trusted`` is 1 where :func:`judge_verdict` finds it strong
  enough; where it does not (0), ``class_agreement`` and its per-class figures are left out
  and the verdict says why (``ImageJudge.verdict``).

The rule of :func:`judge_verdict`: a judge is trusted when its held-out accuracy is at least
``MIN_JUDGE_ACCURACY`` (0.8: a perfect generator then scores at least 0.8, so the agreement
spans most of the way from chance to 1 and a poor model cannot hide among the judge's
errors) and clearly above chance (a one-sided binomial test of its held-out hits against the
share of the largest held-out class, what always naming that class scores, at
``JUDGE_SIGNIFICANCE`` = 0.01: a handful of held-out images cannot show a judge competent).

Large data sets are subsampled, with a fixed draw (:func:`reference_draw`), to
``MAX_REFERENCE`` train images for the judge, the PCA and the manifolds; the nearest-train
distance searches every train image it is given. A run on a VAE's latents, whose data may
not fit in memory, gives it only that draw of the train images and as fixed a draw of at most
``MAX_REFERENCE`` held-out images (``UserImages.judge``'s ``bounded``): the same fit, its
nearest-train distance searched over the draw.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "CV_FOLDS",
    "JUDGE_SIGNIFICANCE",
    "KNN_K",
    "MAX_REFERENCE",
    "MIN_JUDGE_ACCURACY",
    "PCA_DIMS",
    "PIXEL_JUDGE_MAX",
    "ImageJudge",
    "RandomFeatures",
    "frechet_distance",
    "judge_verdict",
    "manifold_coverage",
    "nearest_distance",
    "reference_draw",
]

PCA_DIMS = 16
KNN_K = 3
MAX_REFERENCE = 5000
FEATURE_SEED = 20261124
MIN_JUDGE_ACCURACY = 0.8
JUDGE_SIGNIFICANCE = 0.01
PIXEL_JUDGE_MAX = 3072  # numbers an image (32 x 32 RGB) up to which the pixels are a candidate
CV_FOLDS = 3
_WIDTHS = (32, 64, 64)
_CHUNK = 256  # images (or feature rows) per chunk of a feature pass or a distance search


def reference_draw(n: int) -> np.ndarray:
    """The fixed draw of at most ``MAX_REFERENCE`` of ``n`` images (sorted positions; all
    of them if ``n <= MAX_REFERENCE``): the same in every process and run."""
    bound = MAX_REFERENCE
    if n <= bound:
        return np.arange(n)
    return np.sort(np.random.default_rng(0).choice(n, bound, replace=False))


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """``|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2))`` of two feature sets (N, F)."""
    from scipy import linalg

    mu_a, mu_b = a.mean(axis=0), b.mean(axis=0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    with warnings.catch_warnings():  # fewer points than features: a singular product
        warnings.simplefilter("ignore", linalg.LinAlgWarning)
        root = linalg.sqrtm(cov_a @ cov_b)
    root = np.real(root)  # numerical noise can leave tiny imaginary parts
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2.0 * root))


def nearest_distance(queries: torch.Tensor, references: torch.Tensor) -> float:
    """Mean over ``queries`` (N, F) of the L2 distance to the nearest row of ``references``
    (M, F), searched in chunks (no N x M matrix at once). Either may be uint8 pixels, put
    on [0, 1] a chunk at a time (the same numbers as scaling them whole, in a chunk's
    memory)."""
    best = []
    for chunk in queries.split(_CHUNK):
        chunk = _as_unit(chunk)
        d = torch.cat([torch.cdist(chunk, _as_unit(r)).min(dim=1, keepdim=True).values
                       for r in references.split(4 * _CHUNK)], dim=1)  # (n, chunks)
        best.append(d.min(dim=1).values)
    return float(torch.cat(best).double().mean())


def _knn_radii(points: torch.Tensor, k: int) -> torch.Tensor:
    """Each point's distance to its k-th nearest other point (N,)."""
    radii = []
    for chunk in points.split(_CHUNK):
        d = torch.cdist(chunk, points)  # (n, N); each row holds its own 0
        radii.append(d.kthvalue(k + 1, dim=1).values)
    return torch.cat(radii)


def manifold_coverage(queries: np.ndarray, references: np.ndarray, k: int = KNN_K) -> float:
    """The share of ``queries`` (N, F) inside the union of the balls around each row of
    ``references`` (M, F) that reach its k-th nearest other reference (Kynkäänniemi et al.,
    2019): precision with the samples as queries, recall with the real images as queries
    and the samples as references."""
    refs = torch.from_numpy(references)
    k = min(k, refs.shape[0] - 1)
    if k < 1:
        raise ValueError(f"a manifold needs at least 2 reference points, got {refs.shape[0]}")
    radii = _knn_radii(refs, k)  # (M,)
    inside = [(torch.cdist(chunk, refs) <= radii).any(dim=1)
              for chunk in torch.from_numpy(queries).split(_CHUNK)]
    return float(torch.cat(inside).double().mean())


class RandomFeatures:
    """The fixed random convolutional features of the module docstring.

    Args:
        channels: C of the images (1 or 3).
        seed: seeds the weights (drawn once, on the CPU).
    """

    def __init__(self, channels: int, seed: int = FEATURE_SEED) -> None:
        generator = torch.Generator().manual_seed(seed)
        weights, c_in = [], channels
        for layer, width in enumerate(_WIDTHS):
            w = torch.randn(width, c_in, 3, 3, generator=generator, dtype=torch.float64)
            if layer == 0:  # zero-mean: responds to edges and texture, not to brightness
                w = w - w.mean(dim=(1, 2, 3), keepdim=True)
            weights.append((w / w.flatten(1).norm(dim=1)[:, None, None, None]).float())
            c_in = width
        self.weights, self.channels = weights, channels
        self.dims = 2 * channels + sum(_WIDTHS)

    @torch.no_grad()
    def __call__(self, images: torch.Tensor) -> np.ndarray:
        """Features (N, 2C + 160) float64 of images (N, C, H, W) on [0, 1], or of uint8
        pixels (put on [0, 1] a chunk at a time)."""
        if images.ndim != 4 or images.shape[1] != self.channels:
            raise ValueError(f"images must be (N, {self.channels}, H, W), got "
                             f"{tuple(images.shape)}")
        out = []
        for chunk in images.split(_CHUNK):
            x = _as_unit(chunk) * 2.0 - 1.0  # (n, C, H, W)
            parts = [x.mean(dim=(2, 3)), x.std(dim=(2, 3), correction=0)]
            h = x
            for layer, w in enumerate(self.weights):
                if layer > 0 and min(h.shape[2:]) >= 2:
                    h = F.avg_pool2d(h, 2)
                h = F.relu(F.conv2d(h, w, padding=1))  # (n, width, H', W')
                parts.append(h.mean(dim=(2, 3)))
            out.append(torch.cat(parts, dim=1).double())
        return torch.cat(out).numpy()


def judge_verdict(accuracy: float, held_labels: np.ndarray) -> str | None:
    """None where a class judge of held-out ``accuracy`` on images of ``held_labels`` (N,) is
    trusted (the rule of the module docstring), else one line saying why not."""
    from scipy.stats import binomtest

    n = len(held_labels)
    chance = float(np.bincount(held_labels).max() / n)
    hits = round(accuracy * n)
    p_value = binomtest(hits, n, chance, alternative="greater").pvalue
    if accuracy >= MIN_JUDGE_ACCURACY and p_value < JUDGE_SIGNIFICANCE:
        return None
    why = (f"below {MIN_JUDGE_ACCURACY:g}" if accuracy < MIN_JUDGE_ACCURACY else
           f"not clearly above chance with {n} held-out images (p = {p_value:.2g})")
    return (f"class agreement not judged: the class judge scores {accuracy:.3f} on your "
            f"held-out images ({hits} of {n}; chance {chance:.3f}), {why}, too weak to judge "
            "samples")


def _unit(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 0..255 images as float32 on [0, 1]."""
    return pixels.float() / 255.0


def _as_unit(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels on [0, 1] (:func:`_unit`); anything else as float32, as it is."""
    return _unit(x) if x.dtype == torch.uint8 else x.float()


def _classifier(spaces: dict[str, np.ndarray], labels: np.ndarray) -> tuple[str, object]:
    """The RBF support-vector machine of the module docstring fitted in the space (of
    ``spaces``: name -> inputs (N, F), "pixels" first) that scores best in a stratified
    cross-validation on ``labels`` (N,); without CV_FOLDS images of each class, the first."""
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.svm import SVC

    def svc() -> SVC:
        return SVC(C=10.0, gamma="scale")

    names = list(spaces)
    if len(names) > 1 and np.bincount(labels)[np.unique(labels)].min() >= CV_FOLDS:
        folds = StratifiedKFold(CV_FOLDS, shuffle=True, random_state=0)
        scores = [cross_val_score(svc(), spaces[n], labels, cv=folds).mean() for n in names]
        names = [names[int(np.argmax(scores))]]  # argmax: the first of equal scores
    return names[0], svc().fit(spaces[names[0]], labels)


@dataclass
class ImageJudge:
    """The features, PCA and classifier every score uses, fitted once on a user's train
    images (:meth:`fit`), and the held-out images they are compared with.

    Attributes (beyond the fitted parts):
        judge_space: the class judge's inputs, "pixels" or "features" (None: one class).
        test_accuracy: the class judge's accuracy on the held-out images.
        verdict: None where the class judge is trusted (:func:`judge_verdict`), else why not.
    """

    features: RandomFeatures
    mean: np.ndarray
    std: np.ndarray
    pca: object
    classifier: object | None
    test_accuracy: float | None
    class_names: tuple[str, ...]
    train_flat: torch.Tensor  # (N, C*S*S) uint8, put on [0, 1] a chunk at a time when used
    reference: np.ndarray  # standardised features of (at most MAX_REFERENCE) train images
    held_flat: torch.Tensor  # (n, C*S*S) uint8, as train_flat
    held: np.ndarray  # standardised features of the held-out images
    judge_space: str | None = None
    verdict: str | None = None

    @classmethod
    def fit(
        cls,
        train: torch.Tensor,
        train_labels: torch.Tensor,
        held_out: torch.Tensor,
        held_labels: torch.Tensor,
        class_names: tuple[str, ...],
    ) -> ImageJudge:
        """Fit on ``train`` (uint8 (N, C, S, S)) and its labels; ``held_out`` (at least 2
        images) is what samples are compared with and the judge is tested on."""
        from sklearn.decomposition import PCA

        if held_out.shape[0] < 2 or train.shape[0] < 2:
            raise ValueError(f"the judge needs at least 2 train and 2 held-out images, got "
                             f"{train.shape[0]} and {held_out.shape[0]}")
        features = RandomFeatures(train.shape[1])
        pick = reference_draw(train.shape[0])
        picked = train[torch.from_numpy(pick)]
        raw = features(picked)  # uint8 in: no float copy of every image at once
        mean, std = raw.mean(axis=0), raw.std(axis=0) + 1e-8
        reference = (raw - mean) / std
        held = (features(held_out) - mean) / std
        dims = min(PCA_DIMS, reference.shape[0], reference.shape[1])
        pca = PCA(n_components=dims, random_state=0).fit(reference)
        judge = cls(features, mean, std, pca, None, None, tuple(class_names),
                    train.flatten(1), reference, held_out.flatten(1), held)
        labels = train_labels.numpy()[pick]
        if len(class_names) > 1 and len(np.unique(labels)) > 1:
            spaces = {"features": reference}
            if picked[0].numel() <= PIXEL_JUDGE_MAX:
                spaces = {"pixels": _unit(picked).flatten(1).double().numpy(), **spaces}
            judge.judge_space, judge.classifier = _classifier(spaces, labels)
            truth = held_labels.numpy()
            judge.test_accuracy = float((judge.predict(held_out) == truth).mean())
            judge.verdict = judge_verdict(judge.test_accuracy, truth)
        return judge

    def standardised(self, pixels: torch.Tensor) -> np.ndarray:
        """Standardised features (N, F) of uint8 images (N, C, S, S)."""
        return (self.features(pixels) - self.mean) / self.std

    def predict(self, pixels: torch.Tensor) -> np.ndarray:
        """The judge's class ids (N,) for uint8 images (N, C, S, S); ValueError with one
        class."""
        if self.classifier is None:
            raise ValueError("a data set of one class has no judge of classes")
        inputs = (_unit(pixels).flatten(1).double().numpy() if self.judge_space == "pixels"
                  else self.standardised(pixels))
        return self.classifier.predict(inputs)  # type: ignore[attr-defined]

    def _real_like(self, n: int) -> np.ndarray:
        """Standardised features of ``n`` train images (a fixed draw; all of them if fewer),
        the real counterpart of ``n`` samples."""
        pool = len(self.reference)
        return self.reference[np.random.default_rng(0).choice(pool, size=min(n, pool),
                                                              replace=False)]

    def score(self, pixels: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        """The figures of the module docstring for samples generated for ``labels``
        (``class_agreement`` only where the class judge is trusted).

        Shapes:
            pixels: (N, C, S, S) uint8, N >= 2; labels: (N,) the requested class ids
        """
        if pixels.ndim != 4 or pixels.shape[0] != labels.shape[0] or pixels.shape[0] < 2:
            raise ValueError(f"pixels must be (N, C, S, S) with N = len(labels) >= 2, got "
                             f"{tuple(pixels.shape)} and {tuple(labels.shape)} labels")
        samples = self.standardised(pixels)
        project = self.pca.transform  # type: ignore[attr-defined]
        real = self._real_like(len(samples))
        out: dict[str, float] = {}
        if self.classifier is not None:
            if self.verdict is None:
                agree = self.predict(pixels) == labels.numpy()
                out["class_agreement"] = float(agree.mean())
                for c in sorted(set(labels.tolist())):
                    out[f"class_agreement_{self.class_names[c]}"] = float(
                        agree[labels.numpy() == c].mean())
            assert self.test_accuracy is not None
            out["judge_test_accuracy"] = self.test_accuracy
            out["judge_trusted"] = float(self.verdict is None)
        out.update({
            "precision": manifold_coverage(samples, self.reference),
            "precision_real": manifold_coverage(self.held, self.reference),
            "recall": manifold_coverage(self.held, samples),
            "recall_real": manifold_coverage(self.held, real),
            "frechet_distance": frechet_distance(project(samples), project(self.held)),
            "frechet_distance_real": frechet_distance(project(real), project(self.held)),
            "nearest_train_distance": nearest_distance(pixels.flatten(1), self.train_flat),
            "nearest_train_distance_real": nearest_distance(self.held_flat, self.train_flat),
        })
        return out
