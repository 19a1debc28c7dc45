"""A class-conditional model's class ids and the names people use for them.

diffusers' ``DiTPipeline`` keeps ImageNet's names as ``id2label`` (``model_index.json`` of
``facebook/DiT-XL-2-256``): each id's label is a comma-separated list of synonyms
(``"tench, Tinca tinca"``), and any synonym, stripped of surrounding spaces, names the id
(``DiTPipeline.get_label_ids``). A synonym that two labels share names the later id, as there
("crane": the machine, 517, not the bird, 134). :class:`ClassNames` reads that mapping, takes
ids as well as names, and answers a name it does not know with the closest ones it does.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field

from addnorm.utils.checks import check_int

__all__ = ["ClassNames"]

CLOSEST_SHOWN = 5  # names suggested for one that is not known


@dataclass(frozen=True)
class ClassNames:
    """The names of a model's ``n_classes`` class ids.

    Attributes:
        n_classes: the model's classes, ids ``0 .. n_classes - 1``.
        labels: id -> the full label (``"tench, Tinca tinca"``); ids without one have none.
        ids: each synonym -> its id (the later id's where two labels share it).
    """

    n_classes: int
    labels: Mapping[int, str] = field(default_factory=dict)
    ids: Mapping[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_int("n_classes", self.n_classes, min_value=1)
        ids: dict[str, int] = {}
        for class_id, label in sorted(self.labels.items()):
            if not (isinstance(class_id, int) and 0 <= class_id < self.n_classes):
                raise ValueError(f"id2label names class {class_id!r}, which the model "
                                 f"(classes 0 to {self.n_classes - 1}) does not have")
            if not isinstance(label, str) or not label.strip():
                raise ValueError(f"id2label's label of class {class_id} must be a non-empty "
                                 f"string, got {label!r}")
            for synonym in label.split(","):
                if synonym.strip():
                    ids[synonym.strip()] = class_id
        object.__setattr__(self, "ids", ids)

    @classmethod
    def from_id2label(cls, id2label: object, n_classes: int) -> ClassNames:
        """From ``id2label`` as a pipeline's JSON holds it: string ids (``"0"``) or ints,
        labels as strings; None or empty: no names (classes are named by id only)."""
        if id2label is None:
            return cls(n_classes)
        if not isinstance(id2label, Mapping):
            raise ValueError(f"id2label must map class ids to labels, got "
                             f"{type(id2label).__name__}")
        labels: dict[int, str] = {}
        for key, label in id2label.items():
            text = str(key)
            if not text.isdigit() or isinstance(key, bool):
                raise ValueError(f"id2label's keys must be class ids, got {key!r}")
            labels[int(text)] = label
        return cls(n_classes, labels)

    def name(self, class_id: int) -> str:
        """A short name for ``class_id``: its label's first synonym, or the id itself."""
        label = self.labels.get(class_id)
        return label.split(",")[0].strip() if label else str(class_id)

    def index(self, name: str) -> int:
        """The id ``name`` stands for: an id (``"207"``) or any synonym of a label.

        Raises:
            ValueError: an id outside ``0 .. n_classes - 1``, or a name no label has (the
                message names the closest known names).
        """
        text = name.strip()
        if text.isdigit() and text not in self.ids:
            class_id = int(text)
            if class_id >= self.n_classes:
                raise ValueError(f"class {name!r} is not one of the model's ids "
                                 f"0 to {self.n_classes - 1}")
            return class_id
        if text in self.ids:
            return self.ids[text]
        if not self.ids:
            raise ValueError(f"class {name!r} is neither an id (0 to {self.n_classes - 1}) "
                             "nor a name: the model has no class names (id2label)")
        alike = difflib.get_close_matches(text, list(self.ids), n=CLOSEST_SHOWN, cutoff=0.6)
        containing = [n for n in self.ids if text.lower() in n.lower()]  # "retriever"
        closest = list(dict.fromkeys(alike + containing))[:CLOSEST_SHOWN]
        hint = (f"closest: {', '.join(repr(n) for n in closest)}" if closest
                else "no name is close")
        raise ValueError(f"class {name!r} is not one of the {len(self.ids)} class names "
                         f"({hint}), nor an id 0 to {self.n_classes - 1}")
