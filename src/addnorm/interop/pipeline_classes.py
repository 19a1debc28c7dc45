"""A DiT's label table laid out for diffusers' ``DiTPipeline``, whose guidance assumes
ImageNet's 1000 classes, and read back.

diffusers' ``DiTPipeline.__call__`` (``pipelines/dit/pipeline_dit.py``) guides with a
hard-coded null class, ``class_null = torch.tensor([1000] * batch_size)``, while its
``DiTTransformer2DModel`` keeps the null row at ``num_embeds_ada_norm`` (``LabelEmbedding``:
``num_classes + 1`` rows, the last the null's). A DiT of K classes written as it is (null row
K) is therefore guided right only when K is 1000: for K < 1000, row 1000 does not exist.

:func:`widen_classes` makes the DiT of ``DIFFUSERS_NULL_CLASS`` (1000) classes that computes
the same thing for every id the run knows and guides right in diffusers' pipeline. Its label
table (each block's own, in the per-block layout) has 1001 rows:

    rows 0 .. K-1     the run's classes, unchanged
    rows K .. 999     copies of the run's null row: an id no class has samples
                      unconditionally, as the null class does
    row 1000          the run's null row (diffusers' null class)

:func:`narrow_classes` undoes it when reading a folder back: a DiT of 1000 classes whose
``id2label`` names exactly the ids ``0 .. K-1`` (K < 1000) and whose every label table holds
the null row at rows K .. 999 becomes the DiT of K classes (null row K), equal tensor for
tensor to the one widened; any other DiT (the Hub's 1000 named classes, rows that differ)
is left as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import torch

from addnorm.dit.model import DiT

__all__ = ["DIFFUSERS_NULL_CLASS", "narrow_classes", "widen_classes"]

DIFFUSERS_NULL_CLASS = 1000  # pipeline_dit.py: class_null = torch.tensor([1000] * batch_size)
_TABLE = "class_embed.table.weight"  # the shared layout's key; "block_embeds.i." + it per block


def widen_classes(dit: DiT) -> DiT:
    """``dit`` as a DiT of 1000 classes whose null row is row 1000 (module docstring); the DiT
    itself when it has 1000 classes. The result takes ``dit``'s dtype, device and mode.

    Raises:
        ValueError: the DiT has no null row (``class_dropout`` 0: nothing to guide with), or
            more than 1000 classes (diffusers' null id 1000 would be one of its classes).
    """
    k = dit.cfg.n_classes
    if not dit.cfg.has_null_class:
        raise ValueError("the DiT has no null class row (class_dropout 0), which diffusers' "
                         "DiTPipeline guides with")
    if k > DIFFUSERS_NULL_CLASS:
        raise ValueError(f"the DiT has {k} classes; diffusers' DiTPipeline guides with id "
                         f"{DIFFUSERS_NULL_CLASS} as its null class, one of them")
    if k == DIFFUSERS_NULL_CLASS:
        return dit
    pad = DIFFUSERS_NULL_CLASS + 1 - k  # rows K .. 1000, all the null row
    return _relabelled(dit, DIFFUSERS_NULL_CLASS,
                       lambda table: torch.cat([table[:k], table[k:].expand(pad, -1)]))


def narrow_classes(dit: DiT, named_ids: Collection[int]) -> DiT:
    """The DiT of K classes that :func:`widen_classes` widened, when ``dit`` is such a widened
    DiT and ``named_ids`` (the ids ``id2label`` names) are exactly ``0 .. K-1``; else
    ``dit`` itself (module docstring)."""
    k = len(named_ids)
    if (dit.cfg.n_classes != DIFFUSERS_NULL_CLASS or not dit.cfg.has_null_class
            or not 0 < k < DIFFUSERS_NULL_CLASS or set(named_ids) != set(range(k))):
        return dit
    tables = [t for key, t in dit.state_dict().items() if key.endswith(_TABLE)]
    if not all(torch.equal(t[k:], t[-1:].expand(len(t) - k, -1)) for t in tables):
        return dit  # ids K .. 999 hold classes of their own
    return _relabelled(dit, k, lambda table: torch.cat([table[:k], table[-1:]]))


def _relabelled(dit: DiT, n_classes: int, table_rows) -> DiT:
    """A DiT of ``n_classes`` classes holding ``dit``'s tensors, each label table (V, D)
    replaced by ``table_rows(table)`` (n_classes + 1, D)."""
    parameter = next(dit.parameters())
    state = {key: table_rows(t) if key.endswith(_TABLE) else t
             for key, t in dit.state_dict().items()}
    other = DiT(dataclasses.replace(dit.cfg, n_classes=n_classes))
    other.to(dtype=parameter.dtype, device=parameter.device).load_state_dict(state)
    return other.train(dit.training)
