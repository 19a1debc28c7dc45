"""The Diffusion Transformer (Peebles & Xie, 2023): a class-conditional noise predictor.

    h = patch_embed(x) + pos_embed                   # tokens of p x p patches, fixed 2-D code
    c = timestep_embed(t) + class_embed(y)           # the conditioning vector
    h = block(h, c)   for each of the N blocks       # adaLN-Zero DiT blocks
    out = unpatchify(final_layer(h, c))              # (noise | variance) per pixel

With ``conditioning="per_block"`` (diffusers' layout) block i has its own embedders,
``c_i = block_embeds[i](t, y)``, runs as ``block_i(h, c_i)``, and the final layer takes
``c_0``, as diffusers' final layer reads block 0's embedders (:mod:`addnorm.dit.conditioning`).

Shapes legend: B batch, C input channels, C_out output channels (2C with learned variance),
H = W = input_size, p patch size, g = H / p patches per side, N = g * g tokens, D d_model.

Values are checked once, at this boundary (class ids in range, finite timesteps: one host
sync; in-graph asserts while a graph is captured); the parts check only structure. Labels
checked beforehand (:meth:`DiT.checked_labels`, what a sampler passes at every step) are not
read again, so a call with them and integer timesteps reads nothing back. The forward
compiles with ``fullgraph=True`` and exports with a dynamic batch (:mod:`addnorm.export`).
"""

from __future__ import annotations

import numbers
from typing import cast

import torch
from torch import nn
from torch.export import Dim

from addnorm.diffusion.guidance import classifier_free_guidance
from addnorm.dit.block import DiTBlock
from addnorm.dit.conditioning import ConditionEmbedder
from addnorm.dit.config import DiTConfig
from addnorm.dit.final_layer import FinalLayer
from addnorm.dit.labels import (
    CheckedLabels,
    ClassEmbedder,
    check_class_ids,
    check_class_range,
    class_id_tensor,
    label_drops,
)
from addnorm.dit.patches import PatchEmbed, unpatchify
from addnorm.dit.positions import sincos_2d_positions
from addnorm.family import DynamicShapes, ExportPart
from addnorm.pretrained.mixin import PretrainedMixin
from addnorm.timestep import TimestepEmbedder
from addnorm.utils.checks import (
    assert_in_graph,
    check_bool_mask,
    check_float,
    check_tensor,
    check_weight_dtype,
)

__all__ = ["DiT"]


class DiT(PretrainedMixin, nn.Module):
    """A DiT built from one :class:`DiTConfig` (formulas in the module docstring).

    Submodules: ``patch_embed`` (:class:`PatchEmbed`), ``timestep_embed``
    (:class:`~addnorm.timestep.TimestepEmbedder`: 256 sinusoid channels ``[cos | sin]``,
    Linear-SiLU-Linear), ``class_embed`` (:class:`ClassEmbedder`), ``blocks`` (N
    :class:`DiTBlock`), ``final_layer`` (:class:`FinalLayer`). With
    ``conditioning="per_block"``, ``block_embeds`` (N :class:`ConditionEmbedder`, each a
    ``timestep_embed`` and a ``class_embed``) replaces ``timestep_embed`` and ``class_embed``.
    They are the model's own modules, beside the blocks rather than inside them: block 0's
    also conditions the final layer, and a block sharded alone (FSDP2) is unsharded only
    while it runs.

    ``pos_embed`` (1, N, D) is a *buffer*, saved in the state dict under DiT's key but never
    a parameter (DiT holds it as a frozen ``nn.Parameter``): it is not trained, not handed to
    optimizers and not counted in ``parameters()``. Its layout is documented in
    :mod:`addnorm.dit.positions` (first half of the channels: the column).
    """

    pos_embed: torch.Tensor
    config_class = DiTConfig  # save_pretrained / from_pretrained (addnorm.pretrained.mixin)

    def __init__(self, cfg: DiTConfig) -> None:
        super().__init__()
        if not isinstance(cfg, DiTConfig):
            raise TypeError(f"cfg must be a DiTConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        d = cfg.d_model
        self.patch_embed = PatchEmbed(cfg.in_channels, d, cfg.patch_size)
        self.register_buffer("pos_embed", torch.zeros(1, cfg.grid_size**2, d))
        if cfg.conditioning == "shared":
            self.timestep_embed = TimestepEmbedder(
                d, d_freq=cfg.d_freq, flip_sin_to_cos=cfg.timestep_flip_sin_to_cos,
                downscale_freq_shift=cfg.timestep_downscale_freq_shift,
            )
            self.class_embed = ClassEmbedder(cfg.n_classes, d, class_dropout=cfg.class_dropout)
        else:
            self.block_embeds = nn.ModuleList(
                ConditionEmbedder(
                    d, n_classes=cfg.n_classes, class_dropout=cfg.class_dropout,
                    d_freq=cfg.d_freq, flip_sin_to_cos=cfg.timestep_flip_sin_to_cos,
                    downscale_freq_shift=cfg.timestep_downscale_freq_shift,
                )
                for _ in range(cfg.n_layers)
            )
        self.blocks = nn.ModuleList(
            DiTBlock(d, cfg.n_heads, d_ff=cfg.d_ff, norm_eps=cfg.norm_eps,
                     ff_norm_eps=cfg.ff_norm_eps)
            for _ in range(cfg.n_layers)
        )
        d_patch = cfg.patch_size**2 * cfg.out_channels
        self.final_layer = FinalLayer(d, d_patch, norm_eps=cfg.norm_eps)
        self.initialize_weights()

    @torch.no_grad()
    def initialize_weights(self) -> None:
        """DiT's initialisation, whose adaLN-Zero rule makes a fresh model output exactly 0.

        - every Linear: Xavier-uniform weight (the fused q/k/v projection as one (3D, D)
          matrix, as DiT does), zero bias;
        - ``pos_embed``: the fixed 2-D sin-cos code;
        - patch embedding: Xavier-uniform on the Conv2d weight viewed as a Linear
          ``(D, C * p * p)``, zero bias;
        - label table ~ N(0, 0.02^2); timestep MLP weights ~ N(0, 0.02^2) (biases 0);
          every block's pair alike with ``conditioning="per_block"``;
        - adaLN-Zero: every modulation Linear (blocks and final layer) and the final
          ``linear`` are zero, weight and bias. So every gate is 0 (each block is the
          identity) and the output is exactly zero.
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        grid = self.cfg.grid_size
        self.pos_embed.copy_(sincos_2d_positions(self.cfg.d_model, grid)[None])  # (1, N, D)
        proj = self.patch_embed.proj
        nn.init.xavier_uniform_(proj.weight.view(proj.weight.shape[0], -1))  # (D, C*p*p)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
        modules = list(self.modules())
        for module in modules:  # the label tables first, then the timestep MLPs
            if isinstance(module, ClassEmbedder):
                nn.init.normal_(module.table.weight, std=0.02)
        for module in modules:
            if isinstance(module, TimestepEmbedder):
                module.reset_parameters()
        zeroed: list[nn.Module] = [cast(DiTBlock, b).adaLN_modulation for b in self.blocks]
        zeroed += [self.final_layer.adaLN_modulation, self.final_layer.linear]
        for module in zeroed:  # weights and biases
            for p in module.parameters():
                nn.init.zeros_(p)

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor | float,
        y: torch.Tensor | CheckedLabels,
        *,
        force_drop_ids: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Predict the noise (and, with ``learn_sigma``, the variance) of noisy images.

        Args:
            x: noisy images (or latents).
            t: diffusion timesteps, integer or fractional (moved to x's device): one per
                image, or one for the whole batch (a number, a 0-d or a 1-element tensor,
                broadcast as diffusers' models do).
            y: class ids in [0, n_classes - 1], or ``n_classes`` (the null class, only when
                ``class_dropout > 0``); or :class:`CheckedLabels` from
                :meth:`checked_labels`, whose values are not read again.
            force_drop_ids: bool, True = replace that label by the null class (in any mode).
            generator: random source of label dropout in training mode.

        Shapes:
            x: (B, C, H, W), H = W = input_size; t: (B,), (1,) or (); y: (B,);
            force_drop_ids: (B,)
            returns: (B, C_out, H, W), channels [noise | variance] when learn_sigma
        """
        x, t, y = self._checked_inputs(x, t, y, force_drop_ids)
        grid = self.cfg.grid_size
        h = self.patch_embed(x) + self.pos_embed  # (B, N, D)
        conditions = self._conditions(t, y, force_drop_ids, generator)  # N x (B, D)
        for block, c in zip(self.blocks, conditions, strict=True):
            h = block(h, c)  # (B, N, D)
        patches = self.final_layer(h, conditions[0])  # (B, N, p*p*C_out)
        return unpatchify(patches, self.cfg.patch_size, (grid, grid))  # (B, C_out, H, W)

    def _conditions(
        self,
        t: torch.Tensor,
        y: torch.Tensor,
        force_drop_ids: torch.Tensor | None,
        generator: torch.Generator | None,
    ) -> list[torch.Tensor]:
        """Each block's c: one for all (shared), or each block's own (per-block), whose label
        tables all drop the labels of one draw.

        Shapes:
            t: (B,); y: (B,); force_drop_ids: (B,) bool
            returns: N x (B, D)
        """
        if self.cfg.conditioning == "shared":
            y_emb = self.class_embed(y, force_drop_ids=force_drop_ids, generator=generator)
            return [self.timestep_embed(t) + y_emb] * self.cfg.n_layers
        drops = label_drops(
            y, self.cfg.class_dropout, training=self.training, force_drop_ids=force_drop_ids,
            generator=generator,
        )
        return [embed(t, y, force_drop_ids=drops) for embed in self.block_embeds]

    def forward_with_cfg(
        self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor, guidance_scale: float
    ) -> torch.Tensor:
        """Classifier-free guidance on every noise channel, in DiT's calling convention.

        The batch has 2B rows: y's first half holds the classes, its second half the null id
        ``n_classes``; x's first half is used for both halves (as in DiT), t as given. The C
        noise channels are guided, ``uncond + s * (cond - uncond)``
        (:func:`~addnorm.diffusion.classifier_free_guidance`), and returned in both halves;
        with ``learn_sigma`` the C variance channels are returned unguided, as each half
        computed them (DiT's "standard approach"). DiT's own ``forward_with_cfg`` guides
        channels 0..2 only: ``classifier_free_guidance(out, s, n_guided=3)`` reproduces it.

        Shapes:
            x: (2B, C, H, W); t: (2B,); y: (2B,), y[B:] == n_classes
            returns: (2B, C_out, H, W)
        """
        scale = self._check_guidance(x, y, guidance_scale)
        half = x[: x.shape[0] // 2]  # (B, C, H, W)
        out = self(torch.cat([half, half], dim=0), t, y)  # (2B, C_out, H, W)
        return classifier_free_guidance(out, scale, n_guided=self.cfg.in_channels)

    def checked_labels(self, y: torch.Tensor) -> CheckedLabels:
        """Class ids checked once (every id one of this model's label rows: one read back),
        on the model's device, for many calls: ``self(x, t, labels)`` then reads nothing
        back for them. A sampler's steps call the model this way
        (:func:`addnorm.diffusion.guided_eps_fn` does it for guidance); without guidance::

            labels = dit.checked_labels(y)
            images = diffusion.sample(lambda x, t: dit(x, t, labels), noise)

        Shapes:
            y: (B,) integer class ids; returns ids (B,) long
        """
        n_ids = self._n_label_ids
        ids = class_id_tensor(y).to(self.pos_embed.device, torch.long)  # (B,)
        return CheckedLabels(check_class_ids(ids, n_ids), n_ids)

    @property
    def _n_label_ids(self) -> int:
        """Rows of the label table: the classes, and the null class with class_dropout > 0."""
        return self.cfg.n_classes + int(self.cfg.has_null_class)

    def _check_guidance(self, x: object, y: object, guidance_scale: object) -> float:
        """Guidance needs a null class, an even batch, and the null id in y's second half."""
        cfg = self.cfg
        scale = check_float("guidance_scale", guidance_scale)
        if not cfg.has_null_class:
            raise ValueError(
                "classifier-free guidance needs the null class, but class_dropout is 0: "
                f"the label table has only the {cfg.n_classes} class rows, no null row "
                f"(id {cfg.n_classes})"
            )
        x = check_tensor("x", x, ndim=4)
        y = check_tensor("y", y, ndim=1)
        batch = x.shape[0]
        if batch % 2 or batch == 0 or y.shape[0] != batch:
            raise ValueError(
                f"guidance takes 2B rows, conditional then null: got x batch {batch} and y of "
                f"shape {tuple(y.shape)}"
            )
        if not torch.compiler.is_compiling() and bool((y[batch // 2 :] != cfg.n_classes).any()):
            raise ValueError(
                f"y's second half must be the null class id ({cfg.n_classes}), "
                f"got {y[batch // 2 :].tolist()}"
            )
        return scale

    def _checked_inputs(
        self, x: object, t: object, y: object, force_drop_ids: object
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x, t and y checked against the config (one host sync for the values)."""
        cfg = self.cfg
        x = check_tensor("x", x, ndim=4, floating=True)
        check_weight_dtype("x", x, self.patch_embed.proj.weight)
        batch, channels, height, width = x.shape
        p = cfg.patch_size
        if height % p or width % p:
            raise ValueError(
                f"x image size ({height}, {width}) must be divisible by patch_size ({p})"
            )
        if channels != cfg.in_channels:
            raise ValueError(
                f"x has {channels} channels, the model expects in_channels ({cfg.in_channels});"
                f" got shape {tuple(x.shape)}"
            )
        if (height, width) != (cfg.input_size, cfg.input_size):
            raise ValueError(
                f"x image size ({height}, {width}) must equal (input_size, input_size) = "
                f"({cfg.input_size}, {cfg.input_size}): the fixed position table covers a "
                f"{cfg.grid_size} x {cfg.grid_size} patch grid"
            )
        t = self._checked_timesteps(t, batch).to(x.device)
        y, checked = self._label_ids(y, batch)
        y = y.to(x.device, torch.long)  # (embedding takes long ids)
        if force_drop_ids is not None:
            check_bool_mask("force_drop_ids (True = drop)", force_drop_ids, (batch,))
            if not cfg.has_null_class:
                raise ValueError(
                    "force_drop_ids needs the null class, but class_dropout is 0: there is no "
                    f"null row (id {cfg.n_classes}) in the label table"
                )
        n_ids = self._n_label_ids
        if torch.compiler.is_compiling():
            _assert_values(t, y, n_ids)
        elif batch:
            _check_values(t, None if checked else y, n_ids)
        return x, t, y

    def _label_ids(self, y: object, batch: int) -> tuple[torch.Tensor, bool]:
        """y's (B,) ids, and whether their values were checked before (:class:`CheckedLabels`,
        whose row count must be this model's; their values are not read again)."""
        if not isinstance(y, CheckedLabels):
            return class_id_tensor(y, batch), False
        n_ids = self._n_label_ids
        if y.n_ids != n_ids:
            raise ValueError(
                f"y was checked against {y.n_ids} label rows, this model has {n_ids}: "
                "check the labels with this model's checked_labels"
            )
        return class_id_tensor(y.ids, batch), True

    @staticmethod
    def _checked_timesteps(t: object, batch: int) -> torch.Tensor:
        """t as a (B,) tensor: one per image, or one number, 0-d or (1,) tensor broadcast."""
        if isinstance(t, numbers.Integral) and not isinstance(t, bool):
            if not -(2**63) <= int(t) < 2**63:
                raise ValueError(f"t ({t}) does not fit int64")
            t = torch.tensor(int(t))  # int64, as diffusers makes an int
        elif isinstance(t, numbers.Real) and not isinstance(t, bool):
            t = torch.tensor(float(t), dtype=torch.float64)  # as diffusers makes a float
        t = check_tensor("t", t)
        if t.dtype == torch.bool or t.is_complex():
            raise TypeError(f"t must be an integer or float tensor, got dtype {t.dtype}")
        if t.ndim == 1 and t.shape[0] == batch:
            return t
        if t.ndim == 0 or tuple(t.shape) == (1,):
            return t.expand(batch)  # (B,)
        raise ValueError(
            f"t must have shape ({batch},), one timestep per image (or one for the batch: a "
            f"number, shape () or (1,)), got {tuple(t.shape)}"
        )

    # What export, size estimates and distributed wrapping read (addnorm.family.ModelFamily).
    layer_classes = (DiTBlock,)
    export_parts = {"forward": ExportPart("forward", "out")}

    def example_inputs(
        self, part: str, *, batch: int, length: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Noise x (B, C, H, W), integer timesteps t (B,) and class ids y (B,); the image
        size is the config's, so ``length`` is unused."""
        cfg, size = self.cfg, self.cfg.input_size
        return {
            "x": torch.randn(batch, cfg.in_channels, size, size, generator=generator),
            "t": torch.randint(0, 1000, (batch,), generator=generator),
            "y": torch.randint(0, cfg.n_classes, (batch,), generator=generator),
        }

    def dynamic_shapes(self) -> DynamicShapes:
        """The batch alone."""
        batch = Dim("batch", min=1)
        return {"x": {0: batch}, "t": {0: batch}, "y": {0: batch}}


def _assert_values(t: torch.Tensor, y: torch.Tensor, n_ids: int) -> None:
    """:func:`_check_values` as in-graph asserts, while a graph is captured (no host sync)."""
    in_range = ((y >= 0) & (y < n_ids)).all()
    assert_in_graph(in_range, f"y contains a class id outside [0, {n_ids - 1}]")
    if t.is_floating_point():
        assert_in_graph(torch.isfinite(t).all(), "t must be finite")


def _check_values(t: torch.Tensor, y: torch.Tensor | None, n_ids: int) -> None:
    """Every class id in [0, n_ids) and every timestep finite, read back in one sync; nothing
    is read for labels checked before (``y`` None) with integer timesteps."""
    flags: list[torch.Tensor] = []
    if y is not None:
        low, high = torch.aminmax(y)
        flags += [low.long(), high.long()]
    if t.is_floating_point():
        flags.append(torch.isfinite(t).all().long())
    if not flags:
        return
    values = torch.stack(flags).tolist()  # the one sync
    if y is not None:
        check_class_range(values[0], values[1], n_ids)
    if t.is_floating_point() and not values[-1]:
        raise ValueError(f"t must be finite, got {t[~torch.isfinite(t)][0].item()}")
