"""Where the suite's numerical tolerances come from, named once.

A comparison between two computations of the same quantity can only differ by rounding, and
rounding depends on the order of operations, which depends on the machine: AVX2 and AVX-512
kernels block their sums differently, CUDA differs again, and a reference library may fuse
what we do in two steps. A tolerance must therefore follow from the dtype and the size of the
computation, never from what one machine printed. The rules used across tests/:

- ``u(dtype)``: the unit roundoff (half of ``finfo.eps``): 2**-24 for float32, 2**-53 for
  float64, 2**-8 for bfloat16, 2**-11 for float16.
- One rounding of a value of size s costs at most ``u * s``. A sum or dot product of n terms
  in any order differs from the exact one by at most ``n * u * sum|terms|`` (the classic
  worst-case bound, Higham, *Accuracy and Stability of Numerical Algorithms*, 3.1). Blocked
  and pairwise sums (what BLAS and torch do) stay far below it, near ``sqrt(n) * u``.
- A layer stacks a few such reductions (a projection, a softmax, a norm, a second
  projection); each can grow an error by the condition of its step. For the small models of
  this suite (D <= 256, a few layers, unit-scale activations) that leaves the float32
  difference between two correct implementations at 1e-6 to 1e-5 absolute. ``FLOAT32_MODEL``
  is that bound with a margin of ten for the kernels of other CPUs and of CUDA.
- Identities that are exact in real arithmetic (an encoding's rotation, a norm's
  statistics, a reshape's inverse) are checked in float64, where the same bounds sit near
  1e-13, so ``FLOAT64_EXACT`` still catches a wrong term of any size that matters.
- Where a test compares a float32 result with a float64 oracle, the error is the float32
  computation's own: ``FLOAT32_MODEL`` again.
- Low precision (bfloat16, float16): the result of a float32 computation rounded once is
  within ``u(dtype)`` relative; a computation carried out in the low dtype accumulates a few
  roundings: ``LOW_PRECISION`` gives two to four u with an absolute floor for values near 0.

Tests that need a bound of their own (a sum over a known n, a statistic over draws) derive it
beside the assertion and say so in a comment.
"""

from __future__ import annotations

import torch


def u(dtype: torch.dtype) -> float:
    """Unit roundoff of a floating dtype: half the distance from 1 to the next float."""
    return torch.finfo(dtype).eps / 2


def sum_bound(n: int, total_abs: float, dtype: torch.dtype) -> float:
    """Worst-case rounding error of a sum of n terms whose absolute values add to
    ``total_abs``, in any order (Higham 3.1: ``n * u * sum|x_i|``)."""
    return n * u(dtype) * total_abs


# Two correct float32 implementations of one small model or layer, same weights and inputs
# (unit-scale activations, D <= 256, a few layers): see the module docstring.
FLOAT32_MODEL = {"rtol": 1e-5, "atol": 1e-5}

# An identity exact in real arithmetic, evaluated in float64 on unit-scale values: a few
# hundred roundings of 2**-53 (1.1e-16) stay under 1e-12 with room for the order to change.
FLOAT64_EXACT = {"rtol": 1e-12, "atol": 1e-12}

# A float32 evaluation of a formula against its float64 evaluation, values of size <= ~10:
# a handful of float32 roundings, 2**-24 each, relative.
FLOAT32_ROUNDED = {"rtol": 1e-6, "atol": 1e-6}

# Results held in a low-precision dtype against a float32 or float64 oracle: a few units of
# the dtype's roundoff relative, with an absolute floor of the same size for values near 0.
LOW_PRECISION = {
    torch.bfloat16: {"rtol": 4 * 2**-8, "atol": 4 * 2**-8},
    torch.float16: {"rtol": 4 * 2**-11, "atol": 4 * 2**-11},
}
