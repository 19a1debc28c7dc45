"""``ConfigBase``: what every model family's config shares, its JSON form.

A frozen config dataclass derives from it for ``to_dict()`` (its fields as plain JSON values)
and ``from_dict()`` (unknown keys refused by name). It sits below the families
(``transformer/``, ``dit/``), which each import it from here and not from one another.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from addnorm.utils.checks import check_known_fields

__all__ = ["ConfigBase"]

_C = TypeVar("_C", bound="ConfigBase")


class ConfigBase:
    """JSON helpers shared by the configs (plain dicts of ints, floats, strs, bools, None)."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[_C], data: dict[str, Any]) -> _C:
        """Rebuild a config from :meth:`to_dict`'s output; unknown keys raise ValueError.

        Checkpoints written before ``positions`` was renamed ``position_encoding`` still load.
        """
        if not isinstance(data, dict):
            raise TypeError(f"data must be a dict, got {type(data).__name__}")
        if "positions" in data and "position_encoding" not in data:
            data = {("position_encoding" if k == "positions" else k): v for k, v in data.items()}
        check_known_fields(cls, data, "")
        return cls(**data)
