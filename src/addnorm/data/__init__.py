"""Data: what ships with the install (the date-normalization task, generated; character text
from ``pydoc_data.topics``; scikit-learn's digits, ``digits``), tokenizers (characters, and
``HFTokenizer``, run by ``tokenizers``: for a user's text a byte-level BPE trained here or a
user's file, or a pretrained model's own ``tokenizer.json``), training batch sources
(map-style Datasets drawn by a seeded, resumable sampler: ``sampler``), and a user's own data:
text tokenized into a memory-mapped token file
(``TokenCorpus``, ``TextWindows``), sentence pairs (``PairCorpus``, ``TranslationPairs``,
``PairBatches``), images (``ImageCorpus``, ``ImageDataset``, ``ImageBatches``) and the record a
run keeps of them (``fingerprint``: ``DataRecord``)."""

from addnorm.data.batches import DateBatches, TextBatches
from addnorm.data.dates import FORMATS, format_date, random_examples
from addnorm.data.fingerprint import (
    DataChangedError,
    DataError,
    DataReadError,
    DataRecord,
)
from addnorm.data.hf_tokenizer import HFTokenizer
from addnorm.data.image_batches import ImageBatches, ImageDataset
from addnorm.data.images import ImageCorpus
from addnorm.data.pairs import PairBatches, PairCorpus, TranslationPairs
from addnorm.data.sampler import SampledBatches, SeededSampler
from addnorm.data.text import TextCorpus
from addnorm.data.token_corpus import TextWindows, TokenCorpus
from addnorm.data.tokenizers import CharTokenizer, date_source_tokenizer, date_target_tokenizer

__all__ = [
    "FORMATS",
    "CharTokenizer",
    "DataChangedError",
    "DataError",
    "DataReadError",
    "DataRecord",
    "DateBatches",
    "HFTokenizer",
    "ImageBatches",
    "ImageCorpus",
    "ImageDataset",
    "PairBatches",
    "PairCorpus",
    "SampledBatches",
    "SeededSampler",
    "TextBatches",
    "TextCorpus",
    "TextWindows",
    "TokenCorpus",
    "TranslationPairs",
    "date_source_tokenizer",
    "date_target_tokenizer",
    "format_date",
    "random_examples",
]
