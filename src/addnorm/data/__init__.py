"""Data that ships with the install: the date-normalization task (generated), character text
from ``pydoc_data.topics``, scikit-learn's digits (``digits``), character tokenizers, a
pretrained model's ``tokenizer.json`` (``pretrained_tokenizer``) and training batch
sources."""

from addnorm.data.batches import DateBatches, TextBatches
from addnorm.data.dates import FORMATS, format_date, random_examples
from addnorm.data.text import TextCorpus
from addnorm.data.tokenizers import CharTokenizer, date_source_tokenizer, date_target_tokenizer

__all__ = [
    "FORMATS",
    "CharTokenizer",
    "DateBatches",
    "TextBatches",
    "TextCorpus",
    "date_source_tokenizer",
    "date_target_tokenizer",
    "format_date",
    "random_examples",
]
