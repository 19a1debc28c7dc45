"""The sampler's step spacings: which of the chain's steps a K-step sampler visits.

Oracles: DiT's ``respace.py`` (``space_timesteps``, sections and "ddimK") restated in plain
Python, diffusers' ``DDIMScheduler.set_timesteps`` for the three diffusers spacings, and its
``DPMSolverMultistepScheduler.set_timesteps`` for the two ``dpm-`` spacings (and ``trailing``).
"""

from __future__ import annotations

import pytest

from addnorm.diffusion import sampling_timesteps


def dit_space_timesteps(num_timesteps, section_counts):
    """respace.py's space_timesteps, restated (sections as a list, or "ddimK")."""
    if isinstance(section_counts, str):
        desired = int(section_counts[len("ddim") :])
        for stride in range(1, num_timesteps):
            if len(range(0, num_timesteps, stride)) == desired:
                return set(range(0, num_timesteps, stride))
        raise ValueError("no stride")
    size_per, extra = divmod(num_timesteps, len(section_counts))
    start, steps = 0, []
    for i, count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        frac_stride = 1 if count <= 1 else (size - 1) / (count - 1)
        cur = 0.0
        for _ in range(count):
            steps.append(start + round(cur))
            cur += frac_stride
        start += size
    return set(steps)


COUNTS = [1, 2, 3, 7, 10, 25, 50, 100, 249, 250, 333, 500, 999, 1000]


@pytest.mark.parametrize("steps", COUNTS)
def test_sections_spacing_is_dits_plain_integer_respacing(steps):
    expected = sorted(dit_space_timesteps(1000, [steps]))
    assert sampling_timesteps(1000, steps, "sections") == expected


@pytest.mark.parametrize("steps", COUNTS)
def test_strided_spacing_is_dits_ddim_respacing(steps):
    try:
        expected = sorted(dit_space_timesteps(1000, f"ddim{steps}"))
    except ValueError:  # 1, 249, 333, 999: no integer stride gives exactly that many,
        expected = [i * (1000 // steps) for i in range(steps)]  # so diffusers' "leading"
    assert sampling_timesteps(1000, steps, "strided") == expected


def test_strided_spacing_falls_back_to_leading_where_no_stride_gives_the_count():
    # range(0, 1000, 3) has 334 steps and range(0, 1000, 4) 250: no stride gives 333, and
    # the stride 1000 // 333 = 3 taken 333 times ends at 996 (diffusers' "leading").
    assert sampling_timesteps(1000, 333, "strided") == list(range(0, 999, 3))


@pytest.mark.parametrize("spacing", ["leading", "trailing", "linspace"])
@pytest.mark.parametrize("steps", COUNTS)
def test_diffusers_spacings_match_ddim_scheduler(spacing, steps):
    from diffusers import DDIMScheduler

    scheduler = DDIMScheduler(num_train_timesteps=1000, timestep_spacing=spacing, steps_offset=0)
    scheduler.set_timesteps(steps)
    assert sampling_timesteps(1000, steps, spacing) == sorted(scheduler.timesteps.tolist())


@pytest.mark.parametrize(("theirs", "ours"), [("linspace", "dpm-linspace"),
                                             ("leading", "dpm-leading"),
                                             ("trailing", "trailing")])
@pytest.mark.parametrize("steps", [c for c in COUNTS if c < 1000])
def test_dpm_spacings_match_dpm_solver_scheduler(theirs, ours, steps):
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler(num_train_timesteps=1000, timestep_spacing=theirs)
    scheduler.set_timesteps(steps)
    assert sampling_timesteps(1000, steps, ours) == sorted(scheduler.timesteps.tolist())


def test_dpm_spacings_visit_every_step_where_diffusers_would_repeat_some():
    # 1000 of 1000: the rules' K + 1 points repeat steps (diffusers visits 0 twice with
    # "leading": ratio 1000 // 1001 = 0); addnorm visits each step once (spacing.py).
    from diffusers import DPMSolverMultistepScheduler

    scheduler = DPMSolverMultistepScheduler(num_train_timesteps=1000)
    scheduler.set_timesteps(1000)
    assert len(set(scheduler.timesteps.tolist())) < 1000
    for spacing in ("dpm-linspace", "dpm-leading"):
        assert sampling_timesteps(1000, 1000, spacing) == list(range(1000))


def test_spacings_at_50_of_1000_steps():
    # The module's table, from the formulas: stride 20; (n - 1) / (K - 1) = 20.39; n / K = 20.
    assert sampling_timesteps(1000, 50, "strided") == list(range(0, 1000, 20))
    assert sampling_timesteps(1000, 50, "leading") == list(range(0, 1000, 20))
    assert sampling_timesteps(1000, 50, "trailing") == list(range(19, 1000, 20))
    assert sampling_timesteps(1000, 50, "sections")[:4] == [0, 20, 41, 61]
    assert sampling_timesteps(1000, 50, "sections")[-1] == 999
    # linspace(0, 999, 51) = 0, 19.98, 39.96, ...: 0 left out; 1000 // 51 = 19
    assert sampling_timesteps(1000, 50, "dpm-linspace")[:3] == [20, 40, 60]
    assert sampling_timesteps(1000, 50, "dpm-linspace")[-2:] == [979, 999]
    assert sampling_timesteps(1000, 50, "dpm-leading") == list(range(19, 951, 19))


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((1000, 1001, "leading"), ValueError, r"steps \(1001\) must be <= n_steps \(1000\)"),
        ((1000, 0, "leading"), ValueError, "steps must be >= 1, got 0"),
        ((1000, 50, "uniform"), ValueError, "spacing must be one of 'strided', .*; got 'uniform'"),
        ((1000, 50.0, "leading"), TypeError, r"steps must be an int, got float \(50.0\)"),
    ],
)
def test_bad_spacing_arguments_are_refused(args, error, message):
    with pytest.raises(error, match=message):
        sampling_timesteps(*args)
