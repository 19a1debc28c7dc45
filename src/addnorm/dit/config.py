"""The Diffusion Transformer's frozen, validated configuration and its named presets.

Variants come from ``dataclasses.replace(cfg, ...)`` (validated again); checkpoints store a
config as JSON through ``to_dict()`` / ``from_dict()``. ``DIT_PRESETS`` is the one dict of
named configurations: the paper's twelve models (Peebles & Xie, 2023, Table 1, on 32 x 32 x 4
latents of 256 x 256 ImageNet) and small CPU-sized ones for 8 x 8 single-channel digits.
"""

from __future__ import annotations

from dataclasses import dataclass

from addnorm.config_base import ConfigBase
from addnorm.family import ActivationShape
from addnorm.utils.checks import (
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_probability,
)

__all__ = ["CONDITIONINGS", "DIT_PRESETS", "DiTConfig"]

# Where the conditioning c = timestep_embed(t) + class_embed(y) is computed (DiTConfig).
CONDITIONINGS = ("shared", "per_block")


@dataclass(frozen=True)
class DiTConfig(ConfigBase):
    """A DiT: patchify, N adaLN-Zero blocks, a modulated final layer, unpatchify.

    The defaults are DiT-XL/2, the defaults of the reference ``DiT`` constructor.

    Attributes:
        input_size: height = width of the (latent) image, in pixels.
        patch_size: p; the image becomes ``(input_size / p)^2`` tokens of p x p pixels.
        in_channels: C of the input image.
        d_model: D, the token width (DiT's ``hidden_size``); divisible by ``n_heads`` and
            by 4 (the 2-D position code gives each axis D/4 frequencies).
        n_layers: N, the number of DiT blocks (DiT's ``depth``).
        n_heads: H, attention heads.
        mlp_ratio: F = ``int(D * mlp_ratio)``, the MLP width (DiT's truncation).
        n_classes: the number of class labels; id ``n_classes`` is the null class.
        class_dropout: probability that a label is replaced by the null class in training
            (classifier-free guidance). The null class exists, i.e. the label table has
            ``n_classes + 1`` rows, only when it is > 0, as in DiT.
        learn_sigma: predict the variance too: C_out = 2C (noise | variance), else C.
        d_freq: sinusoid channels of the timestep embedding (256 in DiT).
        timestep_flip_sin_to_cos: timestep features ``[cos | sin]`` (True, DiT) or
            ``[sin | cos]``.
        timestep_downscale_freq_shift: timestep exponent ``-ln(10000) k / (half - shift)``;
            0 in DiT, 1 in diffusers' port (``addnorm.timestep.timestep_embedding``).
        norm_eps: epsilon of the norm before attention and of the final norm (1e-6 in DiT
            and in diffusers' port).
        ff_norm_eps: epsilon of the norm before the MLP: 1e-6 in DiT; diffusers' port uses
            its config's ``norm_eps`` there (1e-5 by default).
        conditioning: ``"shared"`` (DiT): one timestep MLP and label table compute one ``c``
            for every block and the final layer. ``"per_block"`` (diffusers'
            ``DiTTransformer2DModel``): block i has its own pair and its own ``c_i``; the
            final layer uses block 0's (:mod:`addnorm.dit.conditioning`).
    """

    input_size: int = 32
    patch_size: int = 2
    in_channels: int = 4
    d_model: int = 1152
    n_layers: int = 28
    n_heads: int = 16
    mlp_ratio: float = 4.0
    n_classes: int = 1000
    class_dropout: float = 0.1
    learn_sigma: bool = True
    d_freq: int = 256
    timestep_flip_sin_to_cos: bool = True
    timestep_downscale_freq_shift: float = 0.0
    norm_eps: float = 1e-6
    ff_norm_eps: float = 1e-6
    conditioning: str = "shared"

    def __post_init__(self) -> None:
        check_int("input_size", self.input_size, min_value=1)
        check_int("patch_size", self.patch_size, min_value=1)
        if self.input_size % self.patch_size:
            raise ValueError(
                f"input_size ({self.input_size}) must be divisible by patch_size "
                f"({self.patch_size})"
            )
        check_int("in_channels", self.in_channels, min_value=1)
        check_int("d_model", self.d_model, min_value=1)
        check_int("n_layers", self.n_layers, min_value=1)
        check_int("n_heads", self.n_heads, min_value=1)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.d_model % 4:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by 4: the 2-D sin-cos position "
                "code gives each image axis d_model / 4 frequencies"
            )
        check_float("mlp_ratio", self.mlp_ratio, min_value=0.0, min_inclusive=False)
        try:  # d_ff is int(d_model * mlp_ratio), which overflows on an infinite product
            finite = self.d_model * self.mlp_ratio < float("inf")
        except OverflowError:  # d_model too large for a float
            finite = False
        if not finite:
            raise ValueError(
                f"d_model * mlp_ratio must be finite, got {self.d_model} * {self.mlp_ratio}"
            )
        if self.d_ff < 1:
            raise ValueError(
                f"int(d_model * mlp_ratio) must be >= 1, got int({self.d_model} * "
                f"{self.mlp_ratio}) = {self.d_ff}"
            )
        check_int("n_classes", self.n_classes, min_value=1)
        check_probability("class_dropout", self.class_dropout)
        check_bool("learn_sigma", self.learn_sigma)
        check_int("d_freq", self.d_freq, min_value=2)
        check_bool("timestep_flip_sin_to_cos", self.timestep_flip_sin_to_cos)
        shift = check_float("timestep_downscale_freq_shift", self.timestep_downscale_freq_shift)
        if self.d_freq // 2 <= shift:
            raise ValueError(
                f"d_freq // 2 ({self.d_freq // 2}) must exceed timestep_downscale_freq_shift "
                f"({shift})"
            )
        check_float("norm_eps", self.norm_eps, min_value=0.0)
        check_float("ff_norm_eps", self.ff_norm_eps, min_value=0.0)
        check_choice("conditioning", self.conditioning, CONDITIONINGS)

    @property
    def out_channels(self) -> int:
        """C_out: 2C (noise | variance) with ``learn_sigma``, else C."""
        return 2 * self.in_channels if self.learn_sigma else self.in_channels

    @property
    def grid_size(self) -> int:
        """Patches per side, ``input_size / patch_size``; the image has grid_size^2 tokens."""
        return self.input_size // self.patch_size

    @property
    def d_ff(self) -> int:
        """F, the MLP width: ``int(d_model * mlp_ratio)``, as DiT truncates it."""
        return int(self.d_model * self.mlp_ratio)

    @property
    def has_null_class(self) -> bool:
        """Whether the label table has the null row (id ``n_classes``): ``class_dropout > 0``."""
        return self.class_dropout > 0

    def count_parameters(self) -> int:
        """The parameters of ``DiT(self)``, without building it: within 2% of the built
        model's (the label table is counted with its null row). The timestep MLP and label
        table are counted once, or once per block with ``conditioning="per_block"``."""
        d, patch = self.d_model, self.patch_size * self.patch_size
        c_out = self.out_channels
        attention = 4 * d * d + 4 * d
        mlp = 2 * d * self.d_ff + self.d_ff + d
        modulation = 6 * d * d + 6 * d  # adaLN: shift, scale and gate of both sublayers
        patches = patch * self.in_channels * d + d
        conditioning = (self.d_freq * d + d + d * d + d) + (self.n_classes + 1) * d
        n_conditionings = self.n_layers if self.conditioning == "per_block" else 1
        final = 2 * d * d + 2 * d + d * patch * c_out + patch * c_out
        blocks = self.n_layers * (attention + mlp + modulation)
        return patches + n_conditionings * conditioning + blocks + final

    def count_buffers(self) -> int:
        """The numbers of ``DiT(self)``'s fixed 2-D position table (grid_size^2 x D)."""
        return self.grid_size**2 * self.d_model

    def activation_shape(self) -> ActivationShape:
        """The blocks and their widths (the output, C_out numbers per pixel, is left out)."""
        return ActivationShape(
            n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_ff,
            n_heads=self.n_heads, d_output=0,
        )


# The paper's sizes (Table 1): name -> (d_model, n_layers, n_heads).
_PAPER_SIZES = {"S": (384, 12, 6), "B": (768, 12, 12), "L": (1024, 24, 16), "XL": (1152, 28, 16)}

DIT_PRESETS: dict[str, DiTConfig] = {
    # DiT-{S,B,L,XL}/{2,4,8}: 32 x 32 x 4 latents, 1000 ImageNet classes, label dropout 0.1,
    # learned variance, MLP ratio 4 (the defaults above).
    **{
        f"DiT-{size}/{p}": DiTConfig(patch_size=p, d_model=d, n_layers=n, n_heads=h)
        for size, (d, n, h) in _PAPER_SIZES.items()
        for p in (2, 4, 8)
    },
    # CPU-sized: 8 x 8 single-channel digits (sklearn's), 10 classes, 16 tokens of 2 x 2.
    # "DiT-digits" has 1,272,324 parameters (~1.3M); "DiT-digits-tiny" is for smoke tests.
    "DiT-digits": DiTConfig(
        input_size=8, patch_size=2, in_channels=1, d_model=128, n_layers=4, n_heads=4,
        n_classes=10, learn_sigma=False,
    ),
    "DiT-digits-tiny": DiTConfig(
        input_size=8, patch_size=2, in_channels=1, d_model=64, n_layers=2, n_heads=4,
        n_classes=10, learn_sigma=False,
    ),
}
