"""The run's metrics: the sample figure of a run's samples."""

from __future__ import annotations

import numpy as np

from addnorm.training.metrics import draw_samples


def test_draw_samples_draws_digits_side_by_side_and_text_one_line_a_sample():
    digits = [{"class": c, "pixels": [[float(c)] * 8] * 8} for c in range(3)]
    picture = draw_samples(digits, title="three digits")
    assert picture.dtype == np.uint8 and picture.ndim == 3 and picture.shape[2] == 3
    assert picture.shape[1] > picture.shape[0]  # side by side
    text = draw_samples([{"input": "1 May 2001", "prediction": "2001-05-01",
                          "answer": "2001-05-01"}] * 4)
    more = draw_samples([{"input": "1 May 2001", "prediction": "2001-05-01",
                          "answer": "2001-05-01"}] * 8)
    assert more.shape[0] > text.shape[0]  # a line a sample
