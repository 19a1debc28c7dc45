"""addnorm.inspection.figure: watch.png drawn from real records of a 2-layer and a 24-layer
model, and from records without activations; labels stay few enough to read.

Provenance: the records come from ``addnorm.watch`` on seeded tiny models; the drawn axes are
read back from the figure matplotlib builds (its tick labels and panel titles).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import addnorm
from addnorm.inspection.figure import MAX_TICKS, layer_label, plot_watch


def _records(n_layers: int, *, activations: bool = True) -> list[dict]:
    cfg = dataclasses.replace(addnorm.PRESETS["lm-tiny"], vocab_size=32, d_model=16,
                              n_heads=2, d_ff=32, n_layers=n_layers, dropout=0.0)
    torch.manual_seed(0)
    model = addnorm.TransformerLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), 1e-2)
    records = []
    with addnorm.watch(model, activations=activations) as watch:
        for step in (1, 2, 3):
            ids = torch.randint(3, 32, (2, 9), generator=torch.Generator().manual_seed(step))
            model(ids).square().mean().backward()
            watch.before_update()
            optimizer.step()
            optimizer.zero_grad()
            records.append({"step": step, **watch.step()})
    return records


@pytest.mark.parametrize("n_layers", [2, 24])
def test_the_figure_draws_two_and_twenty_four_layers(n_layers, tmp_path, monkeypatch):
    figures = []
    from matplotlib.figure import Figure

    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self),
                                                                     save(self, *a, **k))[1])
    path = plot_watch(_records(n_layers), tmp_path / "watch.png", title="lm")
    assert path.read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles[:3] == ["gradient norm per layer", "update ratio per layer",
                          "gradient norm over depth"]
    heatmap = fig.axes[0]
    labels = [t.get_text() for t in heatmap.get_yticklabels()]
    assert labels[0] == "1" and len(labels) <= MAX_TICKS
    assert len(heatmap.get_images()[0].get_array()) == n_layers  # a row per layer


def test_records_without_activations_still_draw(tmp_path):
    path = plot_watch(_records(2, activations=False), tmp_path / "watch.png")
    assert path.exists()
    with pytest.raises(ValueError, match="no watch records"):
        plot_watch([], tmp_path / "none.png")


def test_layer_labels_count_from_one_and_name_the_stack_when_there_are_several():
    assert layer_label("blocks.layers.0", ["blocks.layers.0", "blocks.layers.1"]) == "1"
    paths = ["encoder.layers.0", "decoder.layers.0", "decoder.layers.1"]
    assert [layer_label(p, paths) for p in paths] == ["enc 1", "dec 1", "dec 2"]
