"""pe-sigmoid: seed 000's contrast of a sigmoid position code with the sinusoids, decided by
how the mean step between neighbouring positions scales with the length (threshold: the
midpoint between not shrinking and the bound every monotone code within (0, 1) obeys).

Provenance: the sinusoids' step is the same at every position by the rotation identity
PE(p + 1) = T(1) PE(p) (float64 angles below 4096: rounding ~1e-12); the sigmoid code's mean
step is checked against the bound d / (L - 1), an inequality any monotone code within (0, 1)
obeys, and against its own definition written out at one position."""

import math

import torch

from addnorm.experiments import pe_sigmoid


def test_the_sigmoid_codes_steps_shrink_with_the_length_and_the_sinusoids_do_not():
    outcome = pe_sigmoid.run(quick=True)
    assert outcome.verdict == "supported"
    codes = outcome.numbers["codes"]
    assert codes["sigmoid"]["slope"] <= pe_sigmoid.SHRINKS
    assert abs(codes["sinusoidal"]["slope"]) < 1e-9  # constant step: slope 0 up to rounding
    for n in pe_sigmoid.LENGTHS:  # any monotone code within (0, 1) stays under the bound
        assert codes["sigmoid"]["mean_step"][str(n)] < pe_sigmoid.monotone_bound(n)


def test_the_sinusoids_step_is_the_same_at_every_position_and_the_sigmoid_is_as_defined():
    step = pe_sigmoid.steps(pe_sigmoid.CODES["sinusoidal"], 4096)
    assert (step.max() - step.min()).item() < 1e-9
    code = pe_sigmoid.sigmoid_code(8)
    j, pos = 5, 7
    omega = pe_sigmoid.BASE ** (-j / pe_sigmoid.D_MODEL)
    assert math.isclose(code[pos, j].item(), 1 / (1 + math.exp(-omega * pos)), rel_tol=1e-12)


def test_the_range_zero_to_one_is_not_what_makes_the_steps_vanish():
    # The sinusoids moved into [0, 1] keep a constant step: half the sinusoids', exactly.
    (reading,) = pe_sigmoid.run(quick=True).also
    assert reading.verdict == "not supported"
    half = pe_sigmoid.steps(pe_sigmoid.shifted_sinusoids, 64)
    full = pe_sigmoid.steps(pe_sigmoid.CODES["sinusoidal"], 64)
    torch.testing.assert_close(half, full / 2, rtol=1e-12, atol=0.0)


def test_a_sigmoid_that_does_not_saturate_or_sinusoids_that_do_are_not_supported():
    # False worlds: the "sigmoid" code replaced by one whose steps do not shrink (the
    # sinusoids in [0, 1]); the "sinusoidal" one by the sigmoid code itself.
    steady = pe_sigmoid.run(quick=True, codes={"sigmoid": pe_sigmoid.shifted_sinusoids})
    assert steady.verdict == "not supported"
    fading = pe_sigmoid.run(quick=True, codes={"sinusoidal": pe_sigmoid.sigmoid_code})
    assert fading.verdict == "not supported"
