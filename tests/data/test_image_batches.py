"""The dataset a DataLoader takes of a user's images, and the batches the DiT trains on.

Provenance: the dataset's images are the corpus's split on the model's scale (an identity); a
batch replays from a copy of its generator, and its first image is the one the generator's
first draw picks (random.Random, the sampler's generator); the label dropout's share is a
Bernoulli mean, within five standard deviations.
"""

from __future__ import annotations

import random

import pytest
import torch
from image_folders import pixels as _pixels
from image_folders import write_folder

from addnorm.data.image_batches import ImageBatches, ImageDataset
from addnorm.data.images import ImageCorpus, to_model_scale


def test_the_dataset_gives_model_scale_images_to_a_dataloader(tmp_path):
    write_folder(tmp_path, {"a": 5, "b": 5})
    corpus = ImageCorpus.build(tmp_path)
    data = ImageDataset(corpus, "train", image_size=8)
    assert len(data) == len(corpus.train_index)
    images, labels = next(iter(torch.utils.data.DataLoader(data, batch_size=len(data))))
    train, train_labels = corpus.split("train", 8)
    torch.testing.assert_close(images, train.float() / 127.5 - 1.0, rtol=0, atol=0)
    assert images.min() >= -1 and images.max() <= 1
    assert labels.tolist() == train_labels.tolist()


def test_batches_replay_from_their_generator_and_drop_labels_at_the_rate_asked():
    images = to_model_scale(torch.from_numpy(_pixels(0, (20, 3, 8, 8))))
    labels = torch.arange(20) % 4
    source = ImageBatches(images, labels, batch_size=4000, n_steps=1000, class_dropout=0.1,
                          seed=3)
    state = source.state_dict()
    batch = source.next_batch()
    source.load_state_dict(state)
    again = source.next_batch()
    for key in batch:
        assert torch.equal(batch[key], again[key]), key
    first = random.Random(3).randrange(20)  # the generator's first draw picks the first image
    assert torch.equal(batch["images"][0], images[first])
    assert batch["labels"][0] == labels[first]
    assert batch["drop"].dtype == torch.bool
    # 4000 Bernoulli(0.1) draws: the share lies within 5 standard deviations (0.024) of 0.1.
    assert abs(batch["drop"].float().mean().item() - 0.1) < 5 * (0.1 * 0.9 / 4000) ** 0.5


def test_batches_of_the_dataset_equal_batches_of_its_tensors(tmp_path):
    write_folder(tmp_path, {"a": 6, "b": 6})
    corpus = ImageCorpus.build(tmp_path)
    data = ImageDataset(corpus, "train", image_size=8)
    settings = dict(batch_size=5, n_steps=1000, class_dropout=0.3, seed=2)
    of_dataset = ImageBatches(data, **settings)
    of_tensors = ImageBatches(data.images, data.labels, **settings)
    for _ in range(3):
        a, b = of_dataset.next_batch(), of_tensors.next_batch()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(TypeError, match="a dataset of images, or a tensor"):
        ImageBatches(data, data.labels, **settings)
