"""The data order of training (``addnorm.data.sampler``): the seeded sampler draws what
``random.Random`` draws, a ``DataLoader`` given it sees the trainer's items, the batch source
adds its extra draws from the sampler's next bits, and a saved state resumes the order.

Provenance: ``random.Random(seed)`` drawing by hand the same calls in the same order (the
reference for every key and seed); torch's ``DataLoader`` with ``sampler=`` (the reference
for what a map-style dataset and a sampler give); a state saved mid-stream and loaded into a
fresh source (resume: the batches drawn after the save).
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from addnorm.data.sampler import SampledBatches, SeededSampler, rng_state, set_rng_state


def test_the_rng_state_is_json_and_sets_a_generator_to_continue_the_same_draws():
    rng = random.Random(5)
    rng.random()
    state = json.loads(json.dumps(rng_state(rng)))
    assert set(state) == {"version", "internal", "gauss_next"}  # what checkpoints have held
    expected = [rng.random() for _ in range(3)]
    other = random.Random(0)
    set_rng_state(other, state)
    assert [other.random() for _ in range(3)] == expected


def test_the_sampler_draws_randrange_of_its_own_seeded_generator():
    sampler, reference = SeededSampler(37, seed=3), random.Random(3)
    assert [sampler.draw() for _ in range(50)] == [reference.randrange(37) for _ in range(50)]
    it = iter(sampler)
    assert [next(it) for _ in range(5)] == [reference.randrange(37) for _ in range(5)]


def test_a_sampler_with_a_draw_calls_it_with_its_generator():
    sampler = SeededSampler(10, seed=1, draw=lambda rng: 7 * rng.randrange(3) + 1)
    reference = random.Random(1)
    assert [sampler.draw() for _ in range(9)] == [7 * reference.randrange(3) + 1
                                                  for _ in range(9)]


def test_a_dataloader_given_the_sampler_sees_the_trainers_batches():
    dataset = TensorDataset(torch.arange(100) * 3, torch.arange(100) % 7)
    loader = DataLoader(dataset, sampler=SeededSampler(100, seed=4), batch_size=6)
    batches = SampledBatches(dataset, SeededSampler(100, seed=4), batch_size=6,
                             collate=lambda items: dict(zip("xy", torch.utils.data.default_collate(
                                 items), strict=True)))
    for (x, y), _ in zip(loader, range(4), strict=False):
        batch = batches.next_batch()
        assert torch.equal(batch["x"], x) and torch.equal(batch["y"], y)


def test_the_extra_draws_come_from_a_generator_seeded_by_the_next_63_bits():
    dataset = TensorDataset(torch.arange(20.0))

    def draws(batch, generator):
        return {"noise": torch.randn(batch["x"].shape, generator=generator)}

    batches = SampledBatches(dataset, SeededSampler(20, seed=2), batch_size=4, draws=draws,
                             collate=lambda items: {"x": torch.stack([i[0] for i in items])})
    batch = batches.next_batch()
    reference = random.Random(2)
    keys = [reference.randrange(20) for _ in range(4)]
    generator = torch.Generator().manual_seed(reference.getrandbits(63))
    assert torch.equal(batch["x"], torch.tensor(keys, dtype=torch.float32))
    assert torch.equal(batch["noise"], torch.randn(4, generator=generator))


def test_a_saved_state_resumes_the_order_in_a_fresh_source():
    dataset = TensorDataset(torch.arange(50))

    def source():
        return SampledBatches(dataset, SeededSampler(50, seed=9), batch_size=5,
                              collate=lambda items: {"x": torch.stack([i[0] for i in items])})

    first = source()
    first.next_batch()
    state = json.loads(json.dumps(first.state_dict()))
    assert set(state) == {"rng"}  # the format every checkpoint's "data" holds
    expected = [first.next_batch()["x"] for _ in range(3)]
    second = source()
    second.load_state_dict(state)
    assert all(torch.equal(second.next_batch()["x"], e) for e in expected)
    assert second.rng is second.sampler.rng


@pytest.mark.parametrize(("make", "match"), [
    (lambda: SeededSampler(0, seed=1), "n must be >= 1"),
    (lambda: SeededSampler(3, seed=-1), "seed must be >= 0"),
    (lambda: SampledBatches([1], SeededSampler(1, seed=0), batch_size=0), "batch_size"),
])
def test_bad_sizes_and_seeds_are_refused_by_name(make, match):
    with pytest.raises(ValueError, match=match):
        make()
