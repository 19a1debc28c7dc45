"""Claim 7 (seed posts 001 and 003): deep Post-LN trains worse than Pre-LN without
learning-rate warm-up.

Two measurements on 12-layer encoders (Xiong et al., 2020, "On Layer Normalization in the
Transformer Architecture"):

* at initialisation, the gradient norm of each layer's FFN output weight ``ff.w2``: Post-LN's
  grow toward the output layers, Pre-LN's do not (their Fig. 3);
* training curves with Adam at a Transformer-sized learning rate, with and without a linear
  warm-up, on a small synthetic task: reverse a sequence of random tokens.

Gradients that do not grow refute the claim. Whether Post-LN *trains* worse can be told only
once some configuration has learned the task (a loss ``LEARNED`` nats below chance): before
that, as in the quick run's 10 steps, every curve sits at chance and the claim is undecided.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from addnorm.encodings import sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.stacks import Encoder

NAME = "postln-vs-preln"
CLAIM = (
    "A deep Post-LN stack has gradients that grow toward its output layers at initialisation "
    "and trains worse than Pre-LN without learning-rate warm-up."
)
SEEDS = ("001", "003")  # the seed posts the claim comes from
VOCAB, LENGTH, D_MODEL, N_HEADS, D_FF, N_LAYERS = 16, 12, 64, 4, 128, 12
BATCH, LR = 32, 1e-3
GROWS = 1.0  # (last 3 layers) / (first 3 layers) gradient-norm ratio: above = "grow"
LEARNED = 0.5  # nats below chance (ln VOCAB) a final loss must be to show learning


class ReverseModel(nn.Module):
    """Token embedding + sinusoids, an :class:`Encoder`, a linear read-out of each position."""

    def __init__(self, norm_position: str) -> None:
        super().__init__()
        cfg = LayerConfig(d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF,
                          norm_position=norm_position)
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.encoder = Encoder(cfg, N_LAYERS)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("positions", sinusoidal_encoding(LENGTH, D_MODEL))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Shapes: ids (B, L) -> logits (B, L, V)."""
        x = self.embed(ids) * math.sqrt(D_MODEL) + self.positions  # (B, L, D)
        return self.head(self.encoder(x))


def reverse_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(VOCAB, (BATCH, LENGTH), generator=gen)  # (B, L)
    return ids, ids.flip(1)


def layer_gradient_norms(norm_position: str, seeds: range) -> list[float]:
    """Mean over seeds of ||d loss / d ff.w2|| for each layer, at initialisation."""
    totals = [0.0] * N_LAYERS
    for seed in seeds:
        torch.manual_seed(seed)
        model = ReverseModel(norm_position)
        ids, target = reverse_batch(torch.Generator().manual_seed(seed))
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), target.flatten())
        loss.backward()
        params = dict(model.named_parameters())
        for i in range(N_LAYERS):
            grad = params[f"encoder.layers.{i}.ff.w2.weight"].grad
            if grad is None:
                raise RuntimeError(f"layer {i}'s ff.w2 received no gradient")
            totals[i] += grad.norm().item() / len(seeds)
    return totals


def growth_ratio(norms: list[float]) -> float:
    """Mean gradient norm of the last three layers over that of the first three."""
    return sum(norms[-3:]) / sum(norms[:3])


def train(norm_position: str, warmup: int, n_steps: int, seed: int = 0) -> list[float]:
    """Training losses (nats per token) of one run; constant LR after a linear warm-up."""
    torch.manual_seed(seed)
    model = ReverseModel(norm_position)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-9)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    for step in range(n_steps):
        for group in optimizer.param_groups:
            group["lr"] = LR * min(1.0, (step + 1) / warmup) if warmup else LR
        ids, target = reverse_batch(gen)
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _tail(losses: list[float], n: int = 20) -> float:
    tail = losses[-n:]
    return sum(tail) / len(tail)


def run(*, quick: bool = False) -> Outcome:
    seeds = range(4) if quick else range(12)
    grads = {pos: layer_gradient_norms(pos, seeds) for pos in ("post", "pre")}
    growth = {pos: growth_ratio(g) for pos, g in grads.items()}
    n_steps, warmup = (10, 5) if quick else (400, 100)
    curves = {
        (pos, w): train(pos, w, n_steps) for pos in ("post", "pre") for w in (0, warmup)
    }
    final = {f"{pos}-LN, {'warm-up ' + str(w) if w else 'no warm-up'}": _tail(c)
             for (pos, w), c in curves.items()}
    post_cold, pre_cold = _tail(curves["post", 0]), _tail(curves["pre", 0])
    gradients_hold = growth["post"] > GROWS > growth["pre"]
    training_holds = post_cold > pre_cold + 0.1
    best = min(final.values())
    learned = best < math.log(VOCAB) - LEARNED
    undecided_because = ""
    if not gradients_hold:
        supported: bool | None = False
    elif learned:
        supported = training_holds
    else:
        supported = None
        undecided_because = (
            f"after {n_steps} steps no configuration has learned the task yet (best final loss "
            f"{best:.3f}, chance {math.log(VOCAB):.3f}), so the training curves cannot show "
            "whether Post-LN trains worse; the gradients at initialisation do grow as claimed"
            + ("; the full run (without --quick) trains 400 steps" if quick else "")
        )

    fig = new_figure(13, 5)
    left, right = fig.subplots(1, 2)
    layers = range(1, N_LAYERS + 1)
    for pos, marker in (("post", "o-"), ("pre", "s-")):
        g = grads[pos]
        left.plot(layers, [v / g[0] for v in g], marker,
                  label=f"{pos.capitalize()}-LN (layer 1: {g[0]:.3f})")
    left.axhline(1.0, color="gray", linestyle=":")
    left.set(title=f"Gradient norm of each layer's FFN W2 at init ({len(seeds)} seeds)",
             xlabel="layer (1 = input side)", ylabel="||dL/dW2|| relative to layer 1")
    left.legend()
    left.grid(alpha=0.3, which="both")
    styles = {("post", 0): "tab:red", ("post", warmup): "tab:orange",
              ("pre", 0): "tab:blue", ("pre", warmup): "tab:cyan"}
    for (pos, w), curve in curves.items():
        label = f"{pos}-LN, " + (f"warm-up {w} steps" if w else "no warm-up")
        right.plot(_smooth(curve), color=styles[pos, w], label=label,
                   linestyle="-" if w == 0 else "--")
    right.axhline(math.log(VOCAB), color="gray", linestyle=":", label="chance (ln 16)")
    right.set(title=f"Reverse task, {N_LAYERS} layers, Adam lr {LR:g}",
              xlabel="training step", ylabel="cross-entropy (nats/token, smoothed)")
    right.legend()
    right.grid(alpha=0.3)
    headline = (
        f"grad norm last 3 / first 3 layers: Post-LN {growth['post']:.2f}, Pre-LN "
        f"{growth['pre']:.2f}; "
        f"loss after {n_steps} steps without warm-up: Post-LN {post_cold:.3f}, Pre-LN "
        f"{pre_cold:.3f} (with warm-up {_tail(curves['post', warmup]):.3f} / "
        f"{_tail(curves['pre', warmup]):.3f})"
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"addnorm Encoder(LayerConfig(d_model={D_MODEL}, n_heads={N_HEADS}, "
                f"d_ff={D_FF}), {N_LAYERS}) post and pre, on reversing {LENGTH} random tokens "
                f"of {VOCAB}; gradient norms at init over seeds {list(seeds)}; {n_steps} Adam "
                f"steps (lr {LR:g}, batch {BATCH}, seed 0), constant or after a {warmup}-step "
                "linear warm-up; losses averaged over the last 20 steps."),
        numbers={"grad_norm_post": grads["post"], "grad_norm_pre": grads["pre"],
                 "grad_growth_post": growth["post"], "grad_growth_pre": growth["pre"],
                 "gradients_hold": gradients_hold, "training_holds": training_holds,
                 "training_learned": learned,
                 "final_loss": final, "n_steps": n_steps},
        figure=fig, undecided_because=undecided_because,
    )


def _smooth(values: list[float], width: int = 10) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - width] if i >= width else 0.0)
        out.append(total / min(i + 1, width))
    return out
