"""The date-normalization data: one answer per input, correct weekdays, disjoint splits.

The expected answers come from an independent restatement parser written here (its own month
and weekday tables, its own patterns) and from ``datetime`` (weekdays, the calendar).
"""

from __future__ import annotations

import datetime as dt
import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from properties import examples

from addnorm.data.dates import (
    FIRST_YEAR,
    FORMATS,
    LAST_YEAR,
    SPLITS,
    DateExamples,
    date_split,
    dates_in_split,
    format_date,
    random_examples,
)
from addnorm.data.tokenizers import date_source_tokenizer, date_target_tokenizer

# The parser's own tables (lower case), written independently of addnorm.data.dates.
MONTH_WORDS = {
    **{
        m: i + 1
        for i, m in enumerate(
            "january february march april may june july august september october november "
            "december".split()
        )
    },
    **{m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
    **{
        m: i + 1
        for i, m in enumerate(
            "januar februar märz april mai juni juli august september oktober november "
            "dezember".split()
        )
    },
    **{
        m: i + 1
        for i, m in enumerate(
            "janvier février mars avril mai juin juillet août septembre octobre novembre "
            "décembre".split()
        )
    },
    **{
        m: i + 1
        for i, m in enumerate(
            "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre "
            "diciembre".split()
        )
    },
}
# Weekday words -> datetime.weekday() (Monday = 0), in every language used.
WEEKDAY_WORDS = {
    **{
        w: i
        for i, w in enumerate("monday tuesday wednesday thursday friday saturday sunday".split())
    },
    **{w: i for i, w in enumerate("mon tue wed thu fri sat sun".split())},
    **{
        w: i
        for i, w in enumerate("montag dienstag mittwoch donnerstag freitag samstag sonntag".split())
    },
    **{w: i for i, w in enumerate("lundi mardi mercredi jeudi vendredi samedi dimanche".split())},
    **{w: i for i, w in enumerate("lunes martes miércoles jueves viernes sábado domingo".split())},
    **{w: i for i, w in enumerate("월요일 화요일 수요일 목요일 금요일 토요일 일요일".split())},
    **{w: i for i, w in enumerate("月火水木金土日")},
    **{"星期" + w: i for i, w in enumerate("一二三四五六日")},
}
NUMERIC_YMD = [
    re.compile(r"^(\d{4})-(\d{2})-(\d{2})$"),
    re.compile(r"^(\d{4})/(\d{1,2})/(\d{1,2})$"),
    re.compile(r"^(\d{4})\.(\d{2})\.(\d{2})$"),
    re.compile(r"^(\d{4})(\d{2})(\d{2})$"),
    re.compile(r"^(\d{4})\. (\d{1,2})\. (\d{1,2})\.$"),
    re.compile(r"^(\d{4})년 (\d{1,2})월 (\d{1,2})일(?: (\S+))?$"),
    re.compile(r"^(\d{4})年(\d{1,2})月(\d{1,2})日(?:\((\S)\)| (\S+))?$"),
]


def parse(text: str) -> dt.date:
    """Restate a written date as a date; raises ValueError if it is ambiguous or wrong."""
    text = text.lower()
    for pattern in NUMERIC_YMD:
        match = pattern.match(text)
        if match:
            year, month, day = (int(g) for g in match.groups()[:3])
            weekday = next((g for g in match.groups()[3:] if g), None)
            return _checked(year, month, day, weekday)
    words = re.findall(r"[^\W\d_]+", text)
    numbers = re.findall(r"\d+", text)
    years = [int(n) for n in numbers if len(n) == 4]
    days = [int(n) for n in numbers if len(n) <= 2]
    months = [MONTH_WORDS[w] for w in words if w in MONTH_WORDS]
    weekdays = [w for w in words if w in WEEKDAY_WORDS]
    fillers = set(words) - set(MONTH_WORDS) - set(WEEKDAY_WORDS)
    if fillers - {"the", "of", "de", "st", "nd", "rd", "th", "er"}:
        raise ValueError(f"unexpected words {fillers} in {text!r}")
    if len(years) != 1 or len(days) != 1 or len(months) != 1 or len(weekdays) > 1:
        raise ValueError(f"not exactly one year, day and month in {text!r}")
    return _checked(years[0], months[0], days[0], weekdays[0] if weekdays else None)


def _checked(year: int, month: int, day: int, weekday: str | None) -> dt.date:
    date = dt.date(year, month, day)
    if weekday is not None and WEEKDAY_WORDS[weekday] != date.weekday():
        raise ValueError(f"{weekday!r} is not the weekday of {date}")
    return date


EDGE_DATES = [
    dt.date(FIRST_YEAR, 1, 1),
    dt.date(LAST_YEAR, 12, 31),
    dt.date(2000, 2, 29),  # leap day of a leap century
    dt.date(1900, 2, 28),  # 1900 is not a leap year
    dt.date(2026, 11, 21),  # SPEC-style example: a Saturday
    dt.date(2011, 11, 11),
    dt.date(2023, 12, 1),  # French "1er"
    dt.date(2012, 3, 12),
]
dates = st.dates(min_value=dt.date(FIRST_YEAR, 1, 1), max_value=dt.date(LAST_YEAR, 12, 31))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", ["as_is", "lower", "upper"])
def test_every_format_restates_to_its_own_date(fmt, case):
    for date in EDGE_DATES:
        assert parse(format_date(date, fmt, case=case)) == date


@examples(50)
@given(date=dates)
def test_random_dates_in_every_format_map_back_to_one_answer(date):
    # parse is a function, so parse(text) == date for every (date, format) means no string is
    # ever written for two different dates: every input has exactly one correct answer.
    for fmt in FORMATS:
        text = format_date(date, fmt)
        assert parse(text) == date, (fmt, text)


def test_weekday_formats_write_the_calendar_weekday():
    # 21 November 2026 is a Saturday (datetime), 1 January 1900 a Monday.
    saturday, monday = dt.date(2026, 11, 21), dt.date(1900, 1, 1)
    assert saturday.weekday() == 5 and monday.weekday() == 0
    assert format_date(saturday, "en_weekday_dmy") == "Saturday, 21 November 2026"
    assert format_date(saturday, "ko_weekday") == "2026년 11월 21일 토요일"
    assert format_date(monday, "de_weekday").startswith("Montag")


def test_the_restatement_parser_rejects_a_wrong_weekday():
    # The parser's weekday check is what the tests above rely on; show it can fail.
    with pytest.raises(ValueError, match="weekday"):
        parse("Friday, 21 November 2026")


def test_no_format_writes_a_two_digit_year_or_a_day_month_number_order():
    # Every input holds its year as four digits; numeric forms put the year first.
    date = dt.date(2003, 4, 5)
    for fmt in FORMATS:
        text = format_date(date, fmt)
        assert "2003" in text, fmt
        digits_only = re.fullmatch(r"[\d\s./-]+", text)
        if digits_only:
            assert text.startswith("2003"), fmt


def test_splits_are_disjoint_and_cover_the_calendar():
    parts = {split: set(dates_in_split(split)) for split in SPLITS}
    n_days = (dt.date(LAST_YEAR, 12, 31) - dt.date(FIRST_YEAR, 1, 1)).days + 1
    assert sum(len(p) for p in parts.values()) == n_days
    assert set.union(*parts.values()) == {
        dt.date(FIRST_YEAR, 1, 1) + dt.timedelta(days=i) for i in range(n_days)
    }
    # Documented split sizes 80/10/10 percent of a hash: within 1 point of each. crc32 is
    # fixed (no randomness, no floats to round): measured 0.7992 / 0.1014 / 0.0994 of 73049
    # days; a fair hash's binomial std is <= 0.0015 here, so 0.01 is over 6 sigma.
    for split, share in (("train", 0.8), ("val", 0.1), ("test", 0.1)):
        assert abs(len(parts[split]) / n_days - share) < 0.01


def test_examples_come_from_their_split_with_iso_targets():
    train = dates_in_split("train")
    for example in random_examples(train, random.Random(0), 200):
        answer = dt.date.fromisoformat(example.target)
        assert parse(example.source) == answer
        assert date_split(answer) == "train"


def test_examples_repeat_for_the_same_seed():
    train = dates_in_split("train")[:500]
    first = list(random_examples(train, random.Random(7), 50))
    again = list(random_examples(train, random.Random(7), 50))
    assert first == again


def test_the_examples_dataset_draws_what_random_examples_draws():
    """DateExamples.draw makes the calls random_examples makes (the reference): the same
    examples, and the generator left in the same state."""
    examples = DateExamples("train")
    assert examples.dates == dates_in_split("train")
    rng, reference = random.Random(11), random.Random(11)
    drawn = [examples[examples.draw(rng)] for _ in range(300)]
    assert drawn == list(random_examples(examples.dates, reference, 300))
    assert rng.getstate() == reference.getstate()


def test_the_examples_dataset_holds_every_date_in_every_format_and_case_once():
    examples = DateExamples("val")
    n_cased = sum(1 for fmt in FORMATS if format_date(dt.date(2001, 5, 6), fmt, case="upper")
                  != format_date(dt.date(2001, 5, 6), fmt))
    assert len(examples.variants) == len(FORMATS) + 2 * n_cased  # lower and upper besides
    assert len(examples) == len(examples.dates) * len(examples.variants)
    last = examples[len(examples) - 1]
    fmt, case = examples.variants[-1]
    assert last == (format_date(examples.dates[-1], fmt, case=case),
                    examples.dates[-1].isoformat())
    with pytest.raises(IndexError):
        examples[len(examples)]


def test_the_source_vocabulary_covers_every_format_without_unknowns():
    src, tgt = date_source_tokenizer(), date_target_tokenizer()
    for date in EDGE_DATES:
        for fmt in FORMATS:
            for case in ("as_is", "lower", "upper"):
                assert src.unk_id not in src.encode(format_date(date, fmt, case=case))
        assert tgt.decode(tgt.encode(date.isoformat(), add_eos=True)) == date.isoformat()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"date": "2026-11-21", "fmt": "iso"}, TypeError, "date must be a datetime.date"),
        ({"date": dt.date(2026, 1, 1), "fmt": "klingon"}, ValueError, "fmt must be one of"),
        ({"date": dt.date(2026, 1, 1), "fmt": "iso", "case": "title"}, ValueError, "case"),
    ],
)
def test_format_date_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        format_date(**kwargs)


@pytest.mark.parametrize(
    ("dates_arg", "n", "error"),
    [
        ([], 3, ValueError),
        ([dt.date(2026, 1, 1)], -1, ValueError),
        ([dt.date(2026, 1, 1)], 1.5, TypeError),
    ],
)
def test_random_examples_rejects_bad_arguments(dates_arg, n, error):
    with pytest.raises(error):
        list(random_examples(dates_arg, random.Random(0), n))


def test_no_input_is_longer_than_longest_source_length():
    # Random dates of every year, format and case stay within it, and some input reaches it.
    from addnorm.data.dates import longest_source_length

    longest = longest_source_length()
    rng = random.Random(0)
    dates = [dt.date(rng.randrange(FIRST_YEAR, LAST_YEAR + 1), 9, 27) for _ in range(50)]
    lengths = [len(e.source) for e in random_examples(dates, rng, 5000)]
    assert max(lengths) <= longest
    reached = max(
        len(format_date(day, fmt, case=case))
        for day in (dt.date(2026, 9, d) for d in range(20, 27))
        for fmt in FORMATS
        for case in ("as_is", "upper")
    )
    assert reached == longest
