"""Date normalization as translation: human-written dates -> ISO 8601 ``YYYY-MM-DD``.

Every input names its year with four digits and its month by a word, or puts the numbers in
year-month-day order (ISO and the East Asian forms), so each input has exactly one correct
answer: there is no day/month order to guess and no two-digit year. Weekdays, when written,
are the true weekday of the date.

Train, validation and test splits hold *distinct dates*: the split of a date is decided by a
hash of its ISO string (``zlib.crc32``, stable across processes), so no test date is ever seen
in training, in any of its formats.

:class:`DateExamples` is a split's every (date, format, case) example as a map-style
``Dataset``; its ``draw`` picks a key as :func:`random_examples` picks an example.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
import zlib
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from addnorm.utils.checks import check_choice, check_int

__all__ = [
    "FIRST_YEAR",
    "FORMATS",
    "LAST_YEAR",
    "SPLITS",
    "DateExample",
    "DateExamples",
    "date_split",
    "dates_in_split",
    "format_date",
    "longest_source_length",
    "random_example",
    "random_examples",
    "random_variant",
    "source_characters",
]

FIRST_YEAR = 1900
LAST_YEAR = 2099
SPLITS = ("train", "val", "test")
# Percent of dates in each split (by the hash of the ISO date): 80 / 10 / 10.
_SPLIT_BOUNDS = {"train": (0, 80), "val": (80, 90), "test": (90, 100)}

# Month and weekday names; weekday lists start on Monday (``date.weekday() == 0``).
EN_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
EN_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
DE_MONTHS = (
    "Januar",
    "Februar",
    "März",
    "April",
    "Mai",
    "Juni",
    "Juli",
    "August",
    "September",
    "Oktober",
    "November",
    "Dezember",
)
DE_WEEKDAYS = ("Montag", "Dienstag", "Mittwoch", "Donnerstag", "Freitag", "Samstag", "Sonntag")
FR_MONTHS = (
    "janvier",
    "février",
    "mars",
    "avril",
    "mai",
    "juin",
    "juillet",
    "août",
    "septembre",
    "octobre",
    "novembre",
    "décembre",
)
FR_WEEKDAYS = ("lundi", "mardi", "mercredi", "jeudi", "vendredi", "samedi", "dimanche")
ES_MONTHS = (
    "enero",
    "febrero",
    "marzo",
    "abril",
    "mayo",
    "junio",
    "julio",
    "agosto",
    "septiembre",
    "octubre",
    "noviembre",
    "diciembre",
)
ES_WEEKDAYS = ("lunes", "martes", "miércoles", "jueves", "viernes", "sábado", "domingo")
KO_WEEKDAYS = ("월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일")
JA_WEEKDAYS = ("月", "火", "水", "木", "金", "土", "日")
ZH_WEEKDAYS = ("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日")


def _ordinal(day: int) -> str:
    """English ordinal suffix: 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st, 22nd, 23rd."""
    if 10 <= day % 100 <= 20:
        return f"{day}th"
    return f"{day}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(day % 10, 'th') }"


def _en(d: dt.date) -> tuple[str, str, str]:
    """English (month, abbreviated month, weekday) of ``d``."""
    month = EN_MONTHS[d.month - 1]
    return month, month[:3], EN_WEEKDAYS[d.weekday()]


# Each format writes one date; the name says which convention it follows.
_FORMATS: dict[str, Callable[[dt.date], str]] = {
    "en_dmy": lambda d: f"{d.day} {_en(d)[0]} {d.year}",
    "en_dmy_short": lambda d: f"{d.day} {_en(d)[1]} {d.year}",
    "en_dmy_dash": lambda d: f"{d.day:02d}-{_en(d)[1]}-{d.year}",
    "en_mdy": lambda d: f"{_en(d)[0]} {d.day}, {d.year}",
    "en_mdy_short": lambda d: f"{_en(d)[1]} {d.day}, {d.year}",
    "en_mdy_ordinal": lambda d: f"{_en(d)[0]} {_ordinal(d.day)}, {d.year}",
    "en_dmy_ordinal": lambda d: f"the {_ordinal(d.day)} of {_en(d)[0]} {d.year}",
    "en_weekday_dmy": lambda d: f"{_en(d)[2]}, {d.day} {_en(d)[0]} {d.year}",
    "en_weekday_mdy": lambda d: f"{_en(d)[2]}, {_en(d)[0]} {d.day}, {d.year}",
    "en_weekday_short": lambda d: f"{_en(d)[2][:3]}, {d.day} {_en(d)[1]} {d.year}",
    "de": lambda d: f"{d.day}. {DE_MONTHS[d.month - 1]} {d.year}",
    "de_weekday": lambda d: (
        f"{DE_WEEKDAYS[d.weekday()]}, {d.day}. {DE_MONTHS[d.month - 1]} {d.year}"
    ),
    "fr": lambda d: f"{'1er' if d.day == 1 else d.day} {FR_MONTHS[d.month - 1]} {d.year}",
    "fr_weekday": lambda d: f"{FR_WEEKDAYS[d.weekday()]} {d.day} {FR_MONTHS[d.month - 1]} {d.year}",
    "es": lambda d: f"{d.day} de {ES_MONTHS[d.month - 1]} de {d.year}",
    "es_weekday": lambda d: (
        f"{ES_WEEKDAYS[d.weekday()]}, {d.day} de {ES_MONTHS[d.month - 1]} de {d.year}"
    ),
    "iso": lambda d: d.isoformat(),
    "iso_slash": lambda d: f"{d.year}/{d.month:02d}/{d.day:02d}",
    "iso_dot": lambda d: f"{d.year}.{d.month:02d}.{d.day:02d}",
    "iso_basic": lambda d: f"{d.year}{d.month:02d}{d.day:02d}",
    "ymd_unpadded": lambda d: f"{d.year}/{d.month}/{d.day}",
    "ko": lambda d: f"{d.year}년 {d.month}월 {d.day}일",
    "ko_weekday": lambda d: f"{d.year}년 {d.month}월 {d.day}일 {KO_WEEKDAYS[d.weekday()]}",
    "ko_numeric": lambda d: f"{d.year}. {d.month}. {d.day}.",
    "ja_zh": lambda d: f"{d.year}年{d.month}月{d.day}日",
    "ja_weekday": lambda d: f"{d.year}年{d.month}月{d.day}日({JA_WEEKDAYS[d.weekday()]})",
    "zh_weekday": lambda d: f"{d.year}年{d.month}月{d.day}日 {ZH_WEEKDAYS[d.weekday()]}",
}
FORMATS: tuple[str, ...] = tuple(_FORMATS)
# Formats written in Latin letters may also appear in lower or upper case, in these shares.
_CASED = tuple(name for name in FORMATS if name.split("_")[0] in ("en", "de", "fr", "es"))
CASES = ("as_is", "lower", "upper")
_CASE_WEIGHTS = (6, 3, 1)


def format_date(date: dt.date, fmt: str, *, case: str = "as_is") -> str:
    """Write ``date`` in the format named ``fmt`` (one of ``FORMATS``).

    ``case`` is "as_is", "lower" or "upper"; it changes only the letters of word formats.
    """
    if not isinstance(date, dt.date):
        raise TypeError(f"date must be a datetime.date, got {type(date).__name__}")
    check_choice("fmt", fmt, FORMATS)
    check_choice("case", case, CASES)
    text = _FORMATS[fmt](date)
    if case == "lower":
        return text.lower()
    if case == "upper":
        return text.upper()
    return text


def date_split(date: dt.date) -> str:
    """The split ("train", "val" or "test") a date belongs to, from a hash of its ISO form."""
    bucket = zlib.crc32(date.isoformat().encode("ascii")) % 100
    for split, (lo, hi) in _SPLIT_BOUNDS.items():
        if lo <= bucket < hi:
            return split
    raise AssertionError("unreachable: the split bounds cover 0..99")


def dates_in_split(split: str) -> list[dt.date]:
    """All dates from 1 Jan FIRST_YEAR to 31 Dec LAST_YEAR in ``split``, in calendar order."""
    check_choice("split", split, SPLITS)
    day = dt.date(FIRST_YEAR, 1, 1)
    last = dt.date(LAST_YEAR, 12, 31)
    out = []
    while day <= last:
        if date_split(day) == split:
            out.append(day)
        day += dt.timedelta(days=1)
    return out


class DateExample(NamedTuple):
    """A written date (``source``) and its ISO 8601 answer (``target``)."""

    source: str
    target: str


def random_variant(rng: random.Random) -> tuple[str, str]:
    """A format and case: the format uniform, a Latin one's case as_is, lower or upper in
    the shares 6 : 3 : 1 (else as_is)."""
    fmt = rng.choice(FORMATS)
    case = "as_is"
    if fmt in _CASED:
        case = rng.choices(CASES, weights=_CASE_WEIGHTS)[0]
    return fmt, case


def random_example(date: dt.date, rng: random.Random) -> DateExample:
    """One example for ``date``: a uniformly chosen format, Latin formats in a random case."""
    fmt, case = random_variant(rng)
    return DateExample(format_date(date, fmt, case=case), date.isoformat())


def random_examples(dates: list[dt.date], rng: random.Random, n: int) -> Iterator[DateExample]:
    """``n`` examples, each a date drawn uniformly from ``dates`` in a random format.

    All randomness comes from ``rng``, so saving ``rng.getstate()`` saves the data order.
    """
    check_int("n", n, min_value=0)
    if not dates:
        raise ValueError("dates must not be empty")
    for _ in range(n):
        yield random_example(rng.choice(dates), rng)


class DateExamples(torch.utils.data.Dataset):
    """Every example of a split's dates, as a map-style dataset: key ``k`` is date
    ``k // n_variants`` (calendar order) in variant ``k % n_variants`` (a format and case,
    ``variants``); the item is its :class:`DateExample`.

    Args:
        split: "train", "val" or "test".
    """

    def __init__(self, split: str = "train") -> None:
        self.dates = dates_in_split(split)
        self.variants = [(f, c) for f in FORMATS for c in (CASES if f in _CASED else CASES[:1])]
        self._variant_key = {v: i for i, v in enumerate(self.variants)}

    def __len__(self) -> int:
        return len(self.dates) * len(self.variants)

    def __getitem__(self, key: int) -> DateExample:
        if not 0 <= key < len(self):
            raise IndexError(f"example {key} out of range 0 .. {len(self) - 1}")
        day, variant = divmod(key, len(self.variants))
        fmt, case = self.variants[variant]
        date = self.dates[day]
        return DateExample(format_date(date, fmt, case=case), date.isoformat())

    def draw(self, rng: random.Random) -> int:
        """A key drawn from ``rng`` as :func:`random_examples` draws an example: a date
        uniformly, then :func:`random_variant` (the same calls, in the same order)."""
        day = rng.randrange(len(self.dates))  # as rng.choice(dates) draws
        return day * len(self.variants) + self._variant_key[random_variant(rng)]


def source_characters() -> list[str]:
    """Every character an input may contain: printable ASCII plus the letters of the tables.

    Sorted, so the character vocabulary is the same in every process.
    """
    chars = {chr(c) for c in range(32, 127)}
    sample_dates = [dt.date(2026, m, d) for m in range(1, 13) for d in (1, 2, 3, 4, 5, 6, 7)]
    for day in sample_dates:
        for fmt in FORMATS:
            for case in CASES:
                chars.update(format_date(day, fmt, case=case))
    return sorted(chars)


@functools.cache
def longest_source_length() -> int:
    """The most characters any input of any format (and case) has.

    A length adds up the widths of the weekday, the month and the day, and every weekday falls
    on a two-digit day of every month within one year; years always have four digits, so the
    dates of one leap year reach the maximum.
    """
    day, longest = dt.date(2000, 1, 1), 0
    while day.year == 2000:
        for fmt in FORMATS:
            for case in CASES:
                longest = max(longest, len(format_date(day, fmt, case=case)))
        day += dt.timedelta(days=1)
    return longest
