"""Images to patch tokens and back: the named reshapes of DiT, and its patch embedding.

Shapes legend: B batch, C channels, H x W image, p patch size, h x w patch grid
(h = H / p, w = W / p), N = h * w tokens, D d_model.

Token order is row-major over the patch grid: token ``n = i * w + j`` is the patch in grid
row i (top to bottom) and grid column j (left to right), as ``Conv2d`` output flattened by
``flatten(2)``. Two patch layouts appear, both DiT's:

- :func:`patchify` / :func:`unpatchify` (the final layer's output): a patch's p * p * C
  features are ordered ``(row in patch, column in patch, channel)``, channel fastest
  (DiT's ``unpatchify``: ``einsum('nhwpqc->nchpwq')``).
- :class:`PatchEmbed` (the input): ``Conv2d(C, D, kernel=stride=p)``, whose weight
  ``(D, C, p, p)`` viewed as a Linear ``(D, C * p * p)`` reads a patch as
  ``(channel, row, column)``, channel slowest (``F.unfold``'s order).
"""

from __future__ import annotations

import torch
from torch import nn

from addnorm.utils.checks import check_int, check_tensor

__all__ = ["PatchEmbed", "grid_to_tokens", "patchify", "unpatchify"]


def _check_image(x: object, patch_size: int) -> torch.Tensor:
    x = check_tensor("x", x, ndim=4)
    height, width = x.shape[-2:]
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"image size ({height}, {width}) must be divisible by patch_size ({patch_size})"
        )
    return x


def patchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut an image into non-overlapping p x p patches, one token per patch (row-major).

    The inverse of :func:`unpatchify`; a patch's features are ``(row, column, channel)``.

    Shapes:
        x: (B, C, H, W), H and W divisible by p
        returns: (B, N, p * p * C), N = (H / p) * (W / p)
    """
    p = check_int("patch_size", patch_size, min_value=1)
    x = _check_image(x, p)
    batch, channels, height, width = x.shape
    h, w = height // p, width // p
    x = x.reshape(batch, channels, h, p, w, p)  # (B, C, h, p, w, p)
    x = x.permute(0, 2, 4, 3, 5, 1)  # (B, h, w, p, p, C)
    return x.reshape(batch, h * w, p * p * channels)  # (B, N, p*p*C)


def unpatchify(tokens: torch.Tensor, patch_size: int, grid: tuple[int, int]) -> torch.Tensor:
    """Reassemble p x p patches into an image: DiT's ``unpatchify`` for an h x w grid.

    Each token holds one patch as ``(row, column, channel)``, channel fastest; C is its
    width / p^2.

    Shapes:
        tokens: (B, N, p * p * C), N = h * w, grid = (h, w)
        returns: (B, C, h * p, w * p)
    """
    p = check_int("patch_size", patch_size, min_value=1)
    tokens = check_tensor("tokens", tokens, ndim=3)
    h, w = (check_int("grid", n, min_value=1) for n in grid)
    if tokens.shape[1] != h * w or tokens.shape[2] % (p * p):
        raise ValueError(
            f"tokens of shape {tuple(tokens.shape)} do not fit a {h} x {w} grid of "
            f"{p} x {p} patches: need (B, {h * w}, p * p * C)"
        )
    h, w = grid
    batch, _, features = tokens.shape
    channels = features // (p * p)
    x = tokens.reshape(batch, h, w, p, p, channels)  # (B, h, w, p, p, C)
    x = x.permute(0, 5, 1, 3, 2, 4)  # (B, C, h, p, w, p)
    return x.reshape(batch, channels, h * p, w * p)  # (B, C, H, W)


def grid_to_tokens(features: torch.Tensor) -> torch.Tensor:
    """A feature map as a sequence, row-major: ``(B, D, h, w) -> (B, h * w, D)``.

    The result is contiguous: a transposed view would carry its channels-first layout into
    the residual stream (elementwise ops keep their input's layout), and every Linear and
    norm of every block would then copy it first; one copy here replaces them all.

    Shapes:
        features: (B, D, h, w)
        returns: (B, N, D)
    """
    return features.flatten(2).transpose(1, 2).contiguous()  # (B, N, D)


class PatchEmbed(nn.Module):
    """Embed each p x p patch linearly: ``Conv2d(C, D, kernel_size=p, stride=p)``.

    DiT's (timm's) ``PatchEmbed`` without its fixed-size check (the model checks the size).
    Submodule ``proj`` (the Conv2d, with bias); see the module docstring for the layout of its
    weight as a Linear.
    """

    def __init__(self, in_channels: int, d_model: int, patch_size: int) -> None:
        super().__init__()
        self.in_channels = check_int("in_channels", in_channels, min_value=1)
        self.d_model = check_int("d_model", d_model, min_value=1)
        self.patch_size = check_int("patch_size", patch_size, min_value=1)
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One D-wide token per patch, row-major over the patch grid.

        Shapes:
            x: (B, C, H, W), H and W divisible by p
            returns: (B, N, D), N = (H / p) * (W / p)
        """
        x = _check_image(x, self.patch_size)
        if x.shape[1] != self.in_channels:
            raise ValueError(
                f"x has {x.shape[1]} channels, PatchEmbed expects in_channels "
                f"({self.in_channels}); got shape {tuple(x.shape)}"
            )
        return grid_to_tokens(self.proj(x))  # (B, N, D)
