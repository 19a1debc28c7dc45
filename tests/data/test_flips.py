"""Random horizontal flips of the DiT's training images (addnorm.data.flips).

Provenance: a flipped row is ``torch.flip(image, dims=[-1])`` of the drawn image (the
definition), an unflipped row the image itself; the coins come after the batch's other draws
from the same generator, so the timesteps, noise and label dropout equal those of the same
source without flips (bit for bit), and the coins equal ``torch.rand(B) < 0.5`` drawn after
them from a generator in the same state.
"""

from __future__ import annotations

import torch

from addnorm.data.batches import DiffusionDraws
from addnorm.data.flips import FlippedDraws, with_flips
from addnorm.data.image_batches import ImageBatches


def _source(flip: bool, seed: int = 3) -> ImageBatches:
    images = torch.linspace(-1, 1, 20 * 2 * 4 * 4).reshape(20, 2, 4, 4)  # no image is symmetric
    batches = ImageBatches(images, torch.arange(20) % 5, batch_size=16, n_steps=50,
                           class_dropout=0.2, seed=seed)
    return with_flips(batches) if flip else batches


def test_flipped_rows_are_the_drawn_images_mirrored_and_the_rest_unchanged():
    plain, flipped = _source(False), _source(True)
    originals = torch.linspace(-1, 1, 20 * 2 * 4 * 4).reshape(20, 2, 4, 4)
    for _ in range(3):
        state = plain.sampler.rng.getstate()
        keys = [plain.sampler.draw() for _ in range(16)]  # the keys the next batch draws
        plain.sampler.rng.setstate(state)
        a, b = plain.next_batch(), flipped.next_batch()
        assert torch.equal(a["images"], originals[keys])
        coins = b["flipped"]
        assert coins.any() and not coins.all()  # 16 fair coins: both kinds here (seeded)
        assert torch.equal(b["images"][coins], torch.flip(originals[keys][coins], dims=[-1]))
        assert torch.equal(b["images"][~coins], originals[keys][~coins])
        for name in ("labels", "t", "noise", "drop"):  # the other draws are untouched
            assert torch.equal(a[name], b[name]), name


def test_the_coins_come_after_the_other_draws_from_the_same_generator():
    images = torch.randn(6, 1, 3, 3)
    draws = DiffusionDraws(10, 0.1)
    flipped = FlippedDraws(draws)({"images": images}, torch.Generator().manual_seed(7))
    generator = torch.Generator().manual_seed(7)
    draws({"images": images}, generator)
    assert torch.equal(flipped["flipped"], torch.rand(6, generator=generator) < 0.5)


def test_a_resumed_source_draws_the_same_flips():
    source = _source(True)
    source.next_batch()
    state = source.state_dict()
    expected = source.next_batch()
    again = _source(True, seed=99)
    again.load_state_dict(state)
    got = again.next_batch()
    assert torch.equal(got["images"], expected["images"])
    assert torch.equal(got["flipped"], expected["flipped"])
