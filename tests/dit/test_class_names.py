"""ClassNames: a pipeline's id2label read as diffusers' DiTPipeline reads it (the oracle:
``DiTPipeline(..., id2label=...).labels`` and ``get_label_ids``), ids taken as well, and the
closest names offered for an unknown one."""

from __future__ import annotations

import pytest
from small_pipeline import ID2LABEL, autoencoder, transformer

from addnorm.dit.class_names import ClassNames


def test_every_synonym_names_the_id_diffusers_gives_it():
    diffusers = pytest.importorskip("diffusers")
    theirs = diffusers.DiTPipeline(transformer=transformer(), vae=autoencoder(),
                                   scheduler=diffusers.DDIMScheduler(),
                                   id2label={int(k): v for k, v in ID2LABEL.items()})
    names = ClassNames.from_id2label(ID2LABEL, 1000)
    assert dict(names.ids) == theirs.labels
    for name, class_id in theirs.labels.items():
        assert names.index(name) == class_id == theirs.get_label_ids([name])[0]
    assert names.index("crane") == 517  # shared: the later id, as diffusers


def test_ids_are_names_too_and_the_first_synonym_is_the_short_name():
    names = ClassNames.from_id2label(ID2LABEL, 1000)
    assert names.index("207") == 207 and names.index(" 5 ") == 5  # any id of the model
    assert names.name(0) == "tench" and names.name(999) == "toilet tissue"
    assert names.name(5) == "5"  # no label: the id


def test_without_id2label_classes_are_named_by_id():
    names = ClassNames.from_id2label(None, 10)
    assert names.index("3") == 3 and names.name(3) == "3"
    with pytest.raises(ValueError, match=r"class 'cat' is neither an id \(0 to 9\) nor a name: "
                                         r"the model has no class names \(id2label\)"):
        names.index("cat")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("goldfsh", r"class 'goldfsh' is not one of the 9 class names \(closest: 'goldfish'\), "
                    r"nor an id 0 to 999"),
        ("tissue", r"\(closest: 'toilet tissue', 'bathroom tissue'\)"),  # contained in names
        ("zebra", r"\(no name is close\)"),
        ("1000", r"class '1000' is not one of the model's ids 0 to 999"),
    ],
)
def test_an_unknown_name_is_answered_with_the_closest_ones(name, message):
    with pytest.raises(ValueError, match=message):
        ClassNames.from_id2label(ID2LABEL, 1000).index(name)


@pytest.mark.parametrize(
    ("id2label", "n_classes", "message"),
    [
        ({"10": "x"}, 10, r"id2label names class 10, which the model \(classes 0 to 9\) does "
                          "not have"),
        ({"a": "x"}, 10, r"id2label's keys must be class ids, got 'a'"),
        ({"1": ""}, 10, r"id2label's label of class 1 must be a non-empty string, got ''"),
        ({"1": 7}, 10, r"id2label's label of class 1 must be a non-empty string, got 7"),
        (["x"], 10, r"id2label must map class ids to labels, got list"),
    ],
)
def test_a_bad_id2label_is_refused_naming_the_entry(id2label, n_classes, message):
    with pytest.raises(ValueError, match=message):
        ClassNames.from_id2label(id2label, n_classes)
