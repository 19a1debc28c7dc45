"""Seed post 003: "Post-LN Transformers are known to become unstable to train as the layers get
deeper, while Pre-LN Transformers train more stably" (실제로 Post-LN Transformer는 레이어가
깊어질수록 학습이 불안정해지는 것으로 알려져 있으며, Pre-LN Transformer가 더 안정적인 학습을
보입니다), in the paragraph that blames unstable training on gradient flow that explodes or
vanishes in deep stacks.

Two measurements, Post-LN ``norm(x + f(x))`` against Pre-LN ``x + f(norm(x))``:

* Gradient flow at initialisation (Xiong et al., 2020, Fig. 3): for each of ``N_GRAD_SEEDS``
  initialisations of a ``DEEP``-layer encoder, the slope of log ||d loss / d ff.w2|| over the
  layers (least squares over all of them, so a wiggle in one layer does not decide). Post-LN's
  slopes must rank above Pre-LN's beyond their spread (:mod:`repeats`: the rank-sum test at
  5%) and be positive at the median: gradients that grow toward the output. If not, the
  claim's mechanism is absent and the claim is not supported, whatever training shows.
* Training: ``repeats.N_RUNS`` seeds per configuration, Adam at a Transformer-sized
  constant learning rate (no warm-up) on reversing random tokens, at ``SHALLOW`` and
  ``DEEP`` layers. Post-LN must end with a higher loss than Pre-LN at ``DEEP`` layers, and
  its excess over Pre-LN must be larger at ``DEEP`` than at ``SHALLOW`` layers (paired by
  seed), both beyond the spread over seeds.

Training can tell something only once a model has learned: the best configuration's final
loss must be below ``learned_threshold()``, half-way between the loss of guessing uniformly
(ln 16) and that of the best predictor that knows which tokens the input holds but not where
(the bag-of-tokens null model). Above it, as after the quick run's 10 steps, the training
half is undecided.
"""

from __future__ import annotations

import math
import statistics

import torch
from torch import nn

from addnorm.encodings import sinusoidal_encoding
from addnorm.experiments.outcome import Outcome, new_figure
from addnorm.experiments.repeats import N_RUNS, draw_runs, larger, spread
from addnorm.inspection import Watch
from addnorm.transformer.config import LayerConfig
from addnorm.transformer.stacks import Encoder

NAME = "postln-vs-preln"
CLAIM = (
    "Post-LN Transformers become unstable to train as the layers get deeper (gradient flow "
    "that explodes or vanishes across the layers), while Pre-LN Transformers train more "
    "stably."
)
SEEDS = ("003",)  # the seed posts the claim comes from
VOCAB, LENGTH, D_MODEL, N_HEADS, D_FF = 16, 12, 64, 4, 128
SHALLOW, DEEP = 2, 12
BATCH, LR = 32, 1e-3
N_GRAD_SEEDS = 12
TAIL = 20  # steps averaged into a final loss


class ReverseModel(nn.Module):
    """Token embedding + sinusoids, an :class:`Encoder`, a linear read-out of each position."""

    def __init__(self, norm_position: str, n_layers: int) -> None:
        super().__init__()
        cfg = LayerConfig(d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF,
                          norm_position=norm_position)
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.encoder = Encoder(cfg, n_layers)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("positions", sinusoidal_encoding(LENGTH, D_MODEL))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Shapes: ids (B, L) -> logits (B, L, V)."""
        x = self.embed(ids) * math.sqrt(D_MODEL) + self.positions  # (B, L, D)
        return self.head(self.encoder(x))


def reverse_batch(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(VOCAB, (BATCH, LENGTH), generator=gen)  # (B, L)
    return ids, ids.flip(1)


def bag_of_tokens_loss() -> float:
    """Expected loss of predicting each target from the input's token counts alone.

    The target symbol occurs 1 + Binomial(L - 1, 1/V) times among the L inputs; the
    predictor gives it probability count / L.
    """
    p = 1 / VOCAB
    n = LENGTH - 1
    return sum(math.comb(n, k) * p**k * (1 - p) ** (n - k) * -math.log((1 + k) / LENGTH)
               for k in range(n + 1))


def learned_threshold() -> float:
    """Half-way between uniform guessing (ln V) and the bag-of-tokens null model."""
    return (math.log(VOCAB) + bag_of_tokens_loss()) / 2


def layer_gradient_norms(norm_position: str, seed: int) -> list[float]:
    """||d loss / d ff.w2|| of each layer of a fresh ``DEEP``-layer model, one batch, as the
    watch of a training run measures it (:class:`addnorm.inspection.Watch`)."""
    torch.manual_seed(seed)
    model = ReverseModel(norm_position, DEEP)
    ids, target = reverse_batch(torch.Generator().manual_seed(seed))
    watched = Watch(model, activations=False, per_parameter=True)
    loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), target.flatten())
    loss.backward()
    grad_norm = watched.step()["grad_norm"]
    norms = []
    for i in range(DEEP):
        name = f"encoder.layers.{i}.ff.w2.weight"
        if name not in grad_norm:
            raise RuntimeError(f"layer {i}'s ff.w2 received no gradient")
        norms.append(grad_norm[name])
    return norms


def log_slope(norms: list[float]) -> float:
    """Least-squares slope of log(norm) against the layer index: > 0 grows to the output."""
    n = len(norms)
    xs, ys = range(n), [math.log(v) for v in norms]
    x_mean, y_mean = (n - 1) / 2, sum(ys) / n
    return (sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys, strict=True))
            / sum((x - x_mean) ** 2 for x in xs))


def train(norm_position: str, n_layers: int, n_steps: int, seed: int) -> list[float]:
    """Training losses (nats per token) of one run, Adam at a constant LR (no warm-up)."""
    torch.manual_seed(seed)
    model = ReverseModel(norm_position, n_layers)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-9)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    for _ in range(n_steps):
        ids, target = reverse_batch(gen)
        loss = nn.functional.cross_entropy(model(ids).flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _final(losses: list[float]) -> float:
    tail = losses[-TAIL:]
    return sum(tail) / len(tail)


def run(*, quick: bool = False, positions: tuple[str, str] = ("post", "pre")) -> Outcome:
    """``positions``: the stack the claim calls unstable and the one it calls stable; the
    tests swap them to build a world where the claim is false."""
    unstable, stable = positions
    n_grad = 6 if quick else N_GRAD_SEEDS
    n_steps = 10 if quick else 200
    grads = {pos: [layer_gradient_norms(pos, s) for s in range(n_grad)] for pos in positions}
    slopes = {pos: [log_slope(g) for g in grads[pos]] for pos in positions}
    median = {pos: statistics.median(v) for pos, v in slopes.items()}
    gradients_hold = larger(slopes[unstable], slopes[stable]) and median[unstable] > 0
    curves = {(pos, depth): [train(pos, depth, n_steps, seed) for seed in range(N_RUNS)]
              for depth in (SHALLOW, DEEP) for pos in positions}
    final = {key: [_final(c) for c in runs] for key, runs in curves.items()}
    excess = {depth: [a - b for a, b in zip(final[unstable, depth], final[stable, depth],
                                            strict=True)] for depth in (SHALLOW, DEEP)}
    worse_deep = larger(final[unstable, DEEP], final[stable, DEEP])
    grows_with_depth = larger(excess[DEEP], excess[SHALLOW])
    best = min(sum(v) / len(v) for v in final.values())
    learned = best < learned_threshold()
    undecided_because = ""
    if not gradients_hold:
        supported: bool | None = False
    elif learned:
        supported = worse_deep and grows_with_depth
    else:
        supported = None
        undecided_because = (
            f"after {n_steps} steps no configuration has learned the task (best final loss "
            f"{best:.3f}; learned means below {learned_threshold():.3f}, half-way from "
            f"chance {math.log(VOCAB):.3f} to the bag-of-tokens model "
            f"{bag_of_tokens_loss():.3f}), so training cannot show which stack is less "
            "stable; the gradients at initialisation do grow as claimed"
            + ("; the full run (without --quick) trains 200 steps" if quick else "")
        )
    fig = _figure(grads, slopes, curves, final, positions, n_grad)
    headline = (
        f"slope of log grad norm per layer at init ({n_grad} seeds, median): "
        f"{unstable}-LN {median[unstable]:+.4f}, {stable}-LN {median[stable]:+.4f}; "
        f"loss after {n_steps} steps ({N_RUNS} seeds, min-max): "
        + "; ".join(f"{depth} layers {unstable}-LN {_range(final[unstable, depth])} vs "
                    f"{stable}-LN {_range(final[stable, depth])}" for depth in (DEEP, SHALLOW))
    )
    return Outcome(
        name=NAME, claim=CLAIM, seeds=SEEDS, headline=headline, supported=supported, quick=quick,
        method=(f"addnorm Encoder(LayerConfig(d_model={D_MODEL}, n_heads={N_HEADS}, "
                f"d_ff={D_FF})) with norm_position {unstable} and {stable}, reversing "
                f"{LENGTH} random tokens of {VOCAB}. Gradients at init: {DEEP} layers, seeds "
                f"0..{n_grad - 1}, slope of log ||dL/d ff.w2|| over layers. Training: "
                f"{n_steps} Adam steps (lr {LR:g} constant, no warm-up, batch {BATCH}) at "
                f"{SHALLOW} and {DEEP} layers, seeds 0..{N_RUNS - 1}; final loss = mean of "
                f"the last {TAIL} steps. A difference counts when it exceeds the spread over "
                "seeds (one-sided rank-sum test at 5%: with 3 seeds, no overlap)."),
        numbers={"grad_norm": grads, "grad_log_slope": {p: spread(v) for p, v in slopes.items()},
                 "gradients_hold": gradients_hold,
                 "final_loss": {f"{p}-LN, {d} layers": spread(v) for (p, d), v in final.items()},
                 "excess_over_stable": {str(d): spread(v) for d, v in excess.items()},
                 "worse_when_deep": worse_deep, "gap_grows_with_depth": grows_with_depth,
                 "training_learned": learned, "learned_threshold": learned_threshold(),
                 "bag_of_tokens_loss": bag_of_tokens_loss(), "n_steps": n_steps},
        figure=fig, undecided_because=undecided_because,
    )


def _range(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def _figure(grads, slopes, curves, final, positions, n_grad):
    fig = new_figure(16, 5)
    left, middle, right = fig.subplots(1, 3)
    layers = list(range(1, DEEP + 1))
    colors = {positions[0]: "tab:red", positions[1]: "tab:blue"}
    for pos in positions:
        per_layer = [[g[i] / g[0] for g in grads[pos]] for i in range(DEEP)]
        draw_runs(left, layers, per_layer, label=f"{pos}-LN", color=colors[pos])
    left.axhline(1.0, color="gray", linestyle=":")
    left.set(title=f"FFN W2 gradient norm at init, {DEEP} layers ({n_grad} seeds)",
             xlabel="layer (1 = input side)", ylabel="||dL/dW2|| relative to layer 1",
             yscale="log")
    left.legend(fontsize=8)
    left.grid(alpha=0.3, which="both")
    for pos in positions:
        for depth, style in ((DEEP, "-"), (SHALLOW, ":")):
            runs = [_smooth(c) for c in curves[pos, depth]]
            steps = range(1, len(runs[0]) + 1)
            mean = [sum(v) / len(v) for v in zip(*runs, strict=True)]
            middle.plot(steps, mean, style, color=colors[pos], label=f"{pos}-LN, {depth} layers")
            middle.fill_between(steps, [min(v) for v in zip(*runs, strict=True)],
                                [max(v) for v in zip(*runs, strict=True)], color=colors[pos],
                                alpha=0.15)
    middle.axhline(math.log(VOCAB), color="gray", linestyle=":", label="chance (ln 16)")
    middle.axhline(learned_threshold(), color="black", linestyle="--", linewidth=0.8,
                   label="learned below this")
    middle.set(title=f"Reverse task, Adam lr {LR:g}, no warm-up ({N_RUNS} seeds, min-max)",
               xlabel="training step", ylabel="cross-entropy (nats/token, smoothed)")
    middle.legend(fontsize=8)
    middle.grid(alpha=0.3)
    for pos in positions:
        draw_runs(right, [SHALLOW, DEEP], [final[pos, SHALLOW], final[pos, DEEP]],
                  label=f"{pos}-LN", color=colors[pos])
    right.set(title="Final loss against depth", xlabel="layers",
              ylabel=f"mean loss of the last {TAIL} steps (nats/token)",
              xticks=[SHALLOW, DEEP])
    right.legend(fontsize=8)
    right.grid(alpha=0.3)
    return fig


def _smooth(values: list[float], width: int = 10) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - width] if i >= width else 0.0)
        out.append(total / min(i + 1, width))
    return out
