"""DiT's class-label embedding, with label dropout for classifier-free guidance.

Class ids are ``0 .. n_classes - 1``; id ``n_classes`` is the *null class*, the "no label"
condition of classifier-free guidance (Ho & Salimans, 2022). The table has a row for it only
when ``class_dropout > 0``, as in DiT. In training each label is replaced by the null id with
probability ``class_dropout``, so the same network learns the conditional and the
unconditional model.

Shapes legend: B batch, D d_model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from addnorm.utils.checks import check_bool_mask, check_int, check_probability, check_tensor

__all__ = [
    "CheckedLabels",
    "ClassEmbedder",
    "check_class_ids",
    "check_class_range",
    "class_id_tensor",
    "label_drops",
]


def class_id_tensor(y: object, batch: int | None = None) -> torch.Tensor:
    """Class ids as a (B,) integer tensor (B = ``batch`` when given); no host sync."""
    y = check_tensor("y", y)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise TypeError(f"y must be an integer tensor of class ids, got dtype {y.dtype}")
    if y.ndim != 1 or (batch is not None and y.shape[0] != batch):
        want = "(B,)" if batch is None else f"({batch},)"
        raise ValueError(f"y must have shape {want}, one class id per image, got {tuple(y.shape)}")
    return y


def check_class_range(low: int, high: int, n_ids: int) -> None:
    """Raise naming the first class id outside [0, n_ids), given the ids' min and max."""
    if low < 0 or high >= n_ids:
        raise ValueError(
            f"y contains class id {low if low < 0 else high} outside [0, {n_ids - 1}]"
        )


def check_class_ids(y: object, n_ids: int) -> torch.Tensor:
    """Class ids as a (B,) integer tensor with every id in [0, n_ids); one host sync.

    The range check (the sync) is skipped while ``torch.compile`` traces.
    """
    y = class_id_tensor(y)
    if y.numel() and not torch.compiler.is_compiling():
        low, high = torch.stack(torch.aminmax(y)).tolist()  # one sync
        check_class_range(low, high, n_ids)
    return y


@dataclass(frozen=True, eq=False)
class CheckedLabels:
    """Class ids whose values were checked once, for many calls of one model.

    Made by :meth:`addnorm.dit.DiT.checked_labels` (one read back); a DiT called with them as
    ``y`` reads nothing back for them, which is what a sampler's steps pass
    (:func:`addnorm.diffusion.guided_eps_fn`). ``n_ids`` is the number of label rows they were
    checked against (every id is in [0, n_ids)); a model with another count refuses them.

    Shapes:
        ids: (B,) long, on the model's device
    """

    ids: torch.Tensor
    n_ids: int


def label_drops(
    y: torch.Tensor,
    class_dropout: float,
    *,
    training: bool,
    force_drop_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor | None:
    """Which labels become the null class: ``force_drop_ids`` where given (in any mode),
    else in training a draw with probability ``class_dropout`` (with ``generator``), else
    None (none). The one draw of :class:`ClassEmbedder`, and of a per-block DiT, whose
    blocks all drop the labels it picks.

    Shapes:
        y: (B,); force_drop_ids: (B,) bool
        returns: (B,) bool, True = dropped; or None
    """
    if force_drop_ids is not None:
        return force_drop_ids
    if training and class_dropout > 0:
        return torch.rand(y.shape, generator=generator, device=y.device) < class_dropout
    return None


class ClassEmbedder(nn.Module):
    """``table[y]``, after replacing dropped labels by the null id ``n_classes``.

    Labels are dropped in training with probability ``class_dropout`` (drawn with
    ``generator`` when given), and wherever ``force_drop_ids`` is True, in training or not
    (DiT's ``force_drop_ids``, as a bool mask).

    Submodule ``table`` (``nn.Embedding(n_classes + 1, D)`` with the null row when
    ``class_dropout > 0``, else ``n_classes`` rows). Attribute ``null_id`` (= n_classes).
    """

    def __init__(self, n_classes: int, d_model: int, *, class_dropout: float = 0.0) -> None:
        super().__init__()
        self.n_classes = check_int("n_classes", n_classes, min_value=1)
        self.class_dropout = check_probability("class_dropout", class_dropout)
        self.null_id = self.n_classes
        self.has_null_class = self.class_dropout > 0
        self.table = nn.Embedding(self.n_classes + int(self.has_null_class), d_model)

    def forward(
        self,
        y: torch.Tensor,
        *,
        force_drop_ids: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Embed the (possibly dropped) labels.

        Args:
            y: class ids in [0, n_classes], n_classes (the null id) only with a null row.
            force_drop_ids: bool, True = replace this label by the null id.
            generator: the random source of training-time label dropout.

        Shapes:
            y: (B,); force_drop_ids: (B,) bool
            returns: (B, D)
        """
        y = class_id_tensor(y)  # values: checked by the model, or by the table (see _rows)
        if force_drop_ids is not None:
            check_bool_mask("force_drop_ids (True = drop)", force_drop_ids, tuple(y.shape))
            self._check_null_row()
        drop = label_drops(
            y, self.class_dropout, training=self.training, force_drop_ids=force_drop_ids,
            generator=generator,
        )
        if drop is not None:
            y = torch.where(drop, self.null_id, y)  # (B,)
        return self._rows(y)  # (B, D)

    def _rows(self, y: torch.Tensor) -> torch.Tensor:
        """``table[y]``. The range is the embedding kernel's own check, so nothing is read
        back while the ids are fine; on the CPU its IndexError becomes the ValueError of
        :func:`check_class_range` (on CUDA a device-side assert)."""
        if torch.compiler.is_compiling():
            return self.table(y)
        try:
            return self.table(y)
        except IndexError:
            check_class_ids(y, self.table.num_embeddings)  # raises, naming the id
            raise

    def _check_null_row(self) -> None:
        if not self.has_null_class:
            raise ValueError(
                f"labels cannot be dropped: class_dropout is 0, so there is no null class "
                f"(id {self.null_id}) in the label table of {self.n_classes} rows"
            )

    def extra_repr(self) -> str:
        return f"n_classes={self.n_classes}, class_dropout={self.class_dropout}"
