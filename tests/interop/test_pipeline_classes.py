"""A DiT's label table widened to diffusers' 1000 classes (null row 1000) and narrowed back.

Provenance: identities. The widened DiT computes the original's outputs bit for bit for every
id the original knows (the same rows, the same arithmetic) and the null class's for the ids it
does not (rows K .. 1000 are copies of the null row); narrowing the widened DiT gives the
original's tensors back, equal; a DiT that was not widened so is left as it is.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from small_dit import config, perturbed

from addnorm.dit import DiT
from addnorm.interop.pipeline_classes import (
    DIFFUSERS_NULL_CLASS,
    narrow_classes,
    widen_classes,
)


def dit(conditioning: str = "shared", **changes) -> DiT:
    torch.manual_seed(0)
    cfg = dataclasses.replace(config(True), conditioning=conditioning, **changes)
    return perturbed(DiT(cfg), seed=1).eval()


def outputs(model: DiT, y: torch.Tensor) -> torch.Tensor:
    x = torch.randn(len(y), 4, 8, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        return model(x, torch.full((len(y),), 300), y)


@pytest.mark.parametrize("conditioning", ["shared", "per_block"])
def test_the_widened_dit_computes_the_original_and_its_null_past_its_classes(conditioning):
    small = dit(conditioning)  # 5 classes, null row 5
    wide = widen_classes(small)
    assert wide.cfg.n_classes == DIFFUSERS_NULL_CLASS and not wide.training
    known = torch.tensor([0, 4, 5])
    assert torch.equal(outputs(wide, torch.tensor([0, 4, 1000])), outputs(small, known))
    assert torch.equal(outputs(wide, torch.tensor([5, 999, 1000])),
                       outputs(small, torch.tensor([5, 5, 5])))  # unknown ids: the null's


@pytest.mark.parametrize("conditioning", ["shared", "per_block"])
def test_narrowing_the_widened_dit_gives_the_original_back(conditioning):
    small = dit(conditioning).to(torch.float64)
    back = narrow_classes(widen_classes(small), range(5))
    assert back.cfg == small.cfg and next(back.parameters()).dtype == torch.float64
    theirs = small.state_dict()
    assert back.state_dict().keys() == theirs.keys()
    assert all(torch.equal(t, theirs[k]) for k, t in back.state_dict().items())


def test_a_dit_not_widened_so_is_left_as_it_is():
    wide = widen_classes(dit())
    assert narrow_classes(wide, [0, 1, 2, 4]) is wide  # not the ids 0 .. K-1
    assert narrow_classes(wide, range(1000)) is wide  # every id named: the Hub's layout
    assert narrow_classes(wide, []) is wide  # no names: nothing says where the classes end
    with torch.no_grad():
        wide.class_embed.table.weight[700] += 1  # id 700 is a class of its own
    assert narrow_classes(wide, range(5)) is wide
    hub = dit(n_classes=1000)
    assert widen_classes(hub) is hub and narrow_classes(hub, range(5)) is hub


def test_what_diffusers_cannot_guide_is_refused():
    with pytest.raises(ValueError, match="1001 classes; diffusers' DiTPipeline guides with id "
                                         "1000"):
        widen_classes(dit(n_classes=1001))
    with pytest.raises(ValueError, match="no null class row"):
        widen_classes(dit(class_dropout=0.0))
