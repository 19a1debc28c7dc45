"""The ``lm`` task: a decoder-only ``TransformerLM`` on a text (:mod:`addnorm.tasks.lm_data`:
the pydoc topics by character, or a user's files, ``LMTaskConfig.data``).

Training windows are random slices of the train split; the held-out figure is validation
bits per character, ``bpc = mean cross-entropy (nats) / ln 2 / characters``, over
non-overlapping windows that tile the validation split (on a user's text, with bits per byte
and per token: ``UserText.scores``). At the end the model writes a few samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from addnorm.data.batches import TextBatches
from addnorm.data.fingerprint import DataRecord
from addnorm.data.hf_tokenizer import HFTokenizer, TextTokenizer
from addnorm.data.text import TextCorpus
from addnorm.data.token_corpus import TokenCorpus
from addnorm.generation.stop_strings import cut_at_stop, stop_at_strings
from addnorm.tasks.data_settings import check_data_settings
from addnorm.tasks.lm_data import (
    SAMPLE_PROMPTS,
    TextData,
    text_data,
    text_data_for,
    text_data_from_dict,
)
from addnorm.tasks.task import Sizing, TaskConfig
from addnorm.training.best import Validation
from addnorm.training.config import TrainConfig
from addnorm.training.trainer_io import LossFn
from addnorm.transformer import TransformerLM
from addnorm.transformer.config import LM_PRESETS, LMConfig
from addnorm.utils.checks import check_int, check_probability

__all__ = ["SAMPLE_PROMPTS", "LMTask", "LMTaskConfig", "lm_loss"]


def lm_loss(
    model: nn.Module, batch: dict[str, torch.Tensor], *, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, int]:
    """Mean next-character cross-entropy over the batch, and the number of targets."""
    logits = model(batch["ids"])  # (B, L, V)
    targets = batch["targets"]  # (B, L)
    loss = F.cross_entropy(
        logits.flatten(0, 1).float(), targets.flatten(), label_smoothing=label_smoothing
    )
    return loss, targets.numel()


@dataclass(frozen=True)
class LMTaskConfig(TaskConfig):
    """The language-model task's own settings.

    Attributes:
        seq_len: tokens (characters, with the char tokenizer) per training window (and per
            held-out window scored at the end).
        label_smoothing: F.cross_entropy's label_smoothing (the paper: 0.1).
        eval_size: held-out examples scored at the end: at most this many validation
            windows.
        data: your text to train on: a UTF-8 file, a folder of them (searched recursively)
            or a glob; none = the bundled pydoc topics.
        tokenizer: char (one id per character), bpe (a byte-level BPE trained on the data's
            train split with the tokenizers library) or the path of a Hugging Face
            tokenizer.json; other than char needs data.
        vocab_size: the BPE's vocabulary, 259 to 2**20 ids (with tokenizer bpe; none = 2048).
        val_fraction: the end of the data held out for scoring, in (0, 0.5].
        cache_dir: where the data's token file is kept (none = $ADDNORM_CACHE, else
            ~/.cache/addnorm).
        follow_links: read the links in a data folder that lead outside it (without it they
            are skipped, and named).
    """

    resumable: ClassVar[tuple[str, ...]] = ("eval_size", "cache_dir")

    seq_len: int = 128
    label_smoothing: float = 0.0
    eval_size: int = 2000
    data: str | None = None
    tokenizer: str = "char"
    vocab_size: int | None = None
    val_fraction: float = 0.05
    cache_dir: str | None = None
    follow_links: bool = False

    def __post_init__(self) -> None:
        check_int("seq_len", self.seq_len, min_value=1)
        check_probability("label_smoothing", self.label_smoothing)
        check_int("eval_size", self.eval_size, min_value=1)
        check_data_settings(self)


class LMTask:
    """Everything the trainer and the CLI need to know about the language-model task.

    Args:
        tokenizer: the vocabulary; None takes the data's.
        data: the text (:func:`~addnorm.tasks.lm_data.text_data`): a
            :class:`~addnorm.tasks.lm_data.TextData`, a :class:`~addnorm.data.TokenCorpus`
            (a user's files, tokenized), the :class:`~addnorm.data.fingerprint.DataRecord` of
            one (a run read back from its checkpoint: the files are opened, and checked
            unchanged, when training or scoring needs them; generating never does), or None:
            the bundled pydoc topics.
        prompts: the starts the samples of a finished run continue (None: taken from the
            data's held-out text, or ``SAMPLE_PROMPTS`` for the bundled corpus).

    Attributes:
        data: the text (:class:`~addnorm.tasks.lm_data.TextData`).
    """

    name: ClassVar[str] = "lm"
    description: ClassVar[str] = (
        "language model (decoder-only) on the pydoc topics by character, or on your text "
        "(--data, --tokenizer)"
    )
    metric: ClassVar[str] = "val_bpc"
    owned_fields: ClassVar[frozenset[str]] = frozenset({
        "vocab_size", "pad_id", "bos_id", "eos_id",
    })

    def __init__(
        self,
        tokenizer: TextTokenizer | None = None,
        *,
        data: TextData | TokenCorpus | DataRecord | None = None,
        prompts: Sequence[str] | None = None,
    ) -> None:
        self.data = text_data(tokenizer, data, prompts)
        self.tokenizer: TextTokenizer = self.data.tokenizer
        unit = "token" if isinstance(self.tokenizer, HFTokenizer) else "character"
        self.loss_label = f"loss (cross-entropy, nats per {unit})"

    @property
    def record(self) -> DataRecord | None:
        """The record of a user's files; None for the bundled text."""
        return self.data.record

    @property
    def prompts(self) -> tuple[str, ...]:
        """The starts the samples of a finished run continue: given, the bundled ones, or
        taken from a user's held-out text on first use (a loaded run reads no data)."""
        return self.data.prompts()

    @property
    def corpus(self) -> TextCorpus | TokenCorpus:
        """The text, loaded on first use (inference from a checkpoint never needs it)."""
        return self.data.corpus()

    def open_corpus(self, cache_dir: str | None = None) -> TextCorpus | TokenCorpus:
        """The text: the bundled corpus, or the recorded files opened again (checked
        unchanged: ``DataChangedError`` names what changed; their token file in
        ``cache_dir``)."""
        return self.data.corpus(cache_dir)

    @staticmethod
    def default_model_config() -> LMConfig:
        """The preset the default run trains (vocabulary size filled in by ``prepare``)."""
        return dataclasses.replace(LM_PRESETS["lm-tiny"], max_len=256, dropout=0.0)

    @staticmethod
    def default_train_config() -> TrainConfig:
        """A short CPU run: a few minutes."""
        return TrainConfig(
            max_steps=2000,
            max_minutes=5.0,
            batch_size=32,
            lr=2e-3,
            schedule="cosine",
            warmup=100,
            checkpoint_every=500,
            log_every=10,
        )

    @staticmethod
    def default_task_config() -> LMTaskConfig:
        """Windows of 128 characters, no label smoothing."""
        return LMTaskConfig()

    @staticmethod
    def presets() -> Mapping[str, LMConfig]:
        """The decoder-only LM's named configs (``LM_PRESETS``)."""
        return LM_PRESETS

    def prepare(self, cfg: LMConfig) -> LMConfig:
        """``cfg`` with this corpus's vocabulary size and special ids."""
        tok = self.tokenizer
        return dataclasses.replace(
            cfg,
            vocab_size=tok.vocab_size,
            pad_id=tok.pad_id,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
        )

    def check(self, cfg: LMConfig, train_cfg: TrainConfig, task_cfg: LMTaskConfig) -> None:
        """Raise ValueError if the configs cannot train this task: the windows must fit a
        learned position table and be shorter than the validation split they are scored on,
        and the train split must hold a batch of different windows. The data of a run read
        back from a checkpoint must be as recorded (``DataChangedError`` otherwise)."""
        if cfg.position_encoding == "learned" and task_cfg.seq_len > cfg.max_len:
            raise ValueError(
                f"seq_len ({task_cfg.seq_len}) must be <= max_len ({cfg.max_len}) with "
                "learned positions"
            )
        corpus = self.open_corpus(task_cfg.cache_dir)
        unit = self.data.unit
        n_val = len(corpus.ids("val"))
        if task_cfg.seq_len >= n_val:
            raise ValueError(
                f"seq_len ({task_cfg.seq_len}) must be < the validation split ({n_val} {unit})"
            )
        windows = len(corpus.ids("train")) - task_cfg.seq_len - 1
        if windows < train_cfg.batch_size:
            raise ValueError(
                f"the train split ({len(corpus.ids('train'))} {unit}) holds "
                f"{max(windows, 0)} windows of seq_len + 1 ({task_cfg.seq_len + 1}) "
                f"{unit}, fewer than a batch (batch_size {train_cfg.batch_size})"
            )

    def sizing(self, cfg: LMConfig, train_cfg: TrainConfig, task_cfg: LMTaskConfig) -> Sizing:
        """Windows of ``seq_len`` characters, each ``seq_len`` of the text's; the evaluation's
        batch is taken as ``batch_size`` windows."""
        return Sizing(length=task_cfg.seq_len, eval_batch=train_cfg.batch_size,
                      example_units=task_cfg.seq_len)

    def build_model(self, cfg: LMConfig) -> TransformerLM:
        """A fresh model for ``cfg`` (call ``prepare`` first)."""
        return TransformerLM(cfg)

    def batches(
        self, cfg: LMConfig, train_cfg: TrainConfig, task_cfg: LMTaskConfig
    ) -> TextBatches:
        """Random training windows of ``task_cfg.seq_len`` characters."""
        self.check(cfg, train_cfg, task_cfg)
        return TextBatches(
            self.open_corpus(task_cfg.cache_dir),
            batch_size=train_cfg.batch_size,
            length=task_cfg.seq_len,
            seed=train_cfg.seed,
        )

    def loss_fn(self, task_cfg: LMTaskConfig) -> LossFn:
        """``(model, batch) -> (loss, n_tokens)`` with the configured label smoothing."""
        smoothing = task_cfg.label_smoothing

        def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
            return lm_loss(model, batch, label_smoothing=smoothing)

        return loss

    @torch.no_grad()
    def evaluate(
        self, model: TransformerLM, *, seq_len: int = 128, max_windows: int | None = None,
        cache_dir: str | None = None,
    ) -> dict[str, float]:
        """Validation bits per character (no label smoothing), over tiling windows (on a
        user's text with more figures: :meth:`TextData.scores`)."""
        model.eval()
        device = next(model.parameters()).device
        corpus = self.open_corpus(cache_dir)
        windows = corpus.eval_windows("val", seq_len, max_windows=max_windows)
        total, count = 0.0, 0
        for chunk in windows.split(64):
            chunk = chunk.to(device)
            loss, n = lm_loss(model, {"ids": chunk[:, :-1], "targets": chunk[:, 1:]})
            total += loss.item() * n
            count += n
        return self.data.scores(total, count, windows)

    def probe(self, task_cfg: LMTaskConfig) -> None:
        """No probe during training: the held-out figures come at the end (and the loss
        curve shows the way there)."""
        return None

    def evaluate_run(self, model: TransformerLM, task_cfg: LMTaskConfig) -> dict[str, float]:
        """The held-out figures of a finished run (``evaluate`` on ``seq_len`` windows, at most
        ``eval_size`` of them)."""
        return self.evaluate(model, seq_len=task_cfg.seq_len, max_windows=task_cfg.eval_size,
                             cache_dir=task_cfg.cache_dir)

    def validation(self, task_cfg: LMTaskConfig) -> Validation:
        """While training: ``evaluate_run``'s figures, ranked by ``val_bpc`` (lower is
        better). The text has no test split beside its validation split, so the run's final
        ``val_bpc`` is scored on the windows the best was chosen by (as nanoGPT keeps its
        best by validation loss). A run on a user's text keeps its best by default."""
        return Validation("val_bpc", higher_is_better=False,
                          score=lambda model: self.evaluate_run(cast(TransformerLM, model),
                                                                task_cfg),
                          keep_by_default=self.record is not None)

    def run_samples(self, model: TransformerLM) -> list[dict[str, Any]]:
        """``samples`` of ``prompts`` as JSON-ready dicts: prompt and text (the prompt
        continued)."""
        return [{"prompt": p, "text": text} for p, text in self.samples(model, self.prompts)]

    @staticmethod
    def samples_text(samples: list[dict[str, Any]]) -> str:
        """Each sample continuation under its prompt."""
        return "".join(
            f"\nsample (prompt {sample['prompt']!r}):\n{sample['text']}\n" for sample in samples
        )

    @torch.no_grad()
    def sample(
        self,
        model: TransformerLM,
        prompt: str,
        *,
        max_new_tokens: int = 200,
        temperature: float = 0.8,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        stop: Sequence[str] = (),
        compile: bool = False,
        window: int | None = None,
    ) -> str:
        """``prompt`` continued by sampling (greedy when ``temperature`` is 0, which ignores
        ``top_k`` and ``top_p``) with ``max_new_tokens`` characters. The model sees at most
        ``window`` characters at once (None: its ``context``, the windows its run trained
        on), sliding past them (:mod:`addnorm.generation.window`): a longer prompt is
        continued from its last ``window`` characters. The text returned starts with the
        whole prompt.

        ``compile``: the compiled decode step (``GenerationConfig.compile``).

        ``stop``: stop strings. Generation ends once the continuation holds one, and the
        continuation is cut before the first (a stop string inside the prompt does not count).
        """
        model.eval()
        device = next(model.parameters()).device
        encoded = self.tokenizer.encode(prompt)
        if not encoded:
            raise ValueError("prompt must not be empty")
        ids = torch.tensor([encoded], device=device)  # (1, L0)
        config = dataclasses.replace(model.generation_config, max_new_tokens=max_new_tokens,
                                     eos_id=None, compile=compile, window=window)
        if temperature != 0:  # 0 is greedy decoding, which ignores top_k and top_p
            config = dataclasses.replace(
                config, strategy="sample", temperature=temperature, top_k=top_k, top_p=top_p
            )
        stop_fn = stop_at_strings(self.tokenizer.decode, stop) if stop else None
        new = model.generate(ids, config, generator=generator, stop_fn=stop_fn)  # (1, N)
        return prompt + cut_at_stop(self.tokenizer.decode(new[0].tolist()), stop)

    def samples(self, model: TransformerLM, prompts=SAMPLE_PROMPTS) -> list[tuple[str, str]]:
        """(prompt, continuation) pairs for display, from a fixed-seed generator."""
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(0)
        return [(p, self.sample(model, p, generator=generator)) for p in prompts]

    @classmethod
    def from_config(cls, task_cfg: LMTaskConfig) -> LMTask:
        """The task a new run trains: the text ``task_cfg`` names
        (:func:`~addnorm.tasks.lm_data.text_data_for`)."""
        return cls(data=text_data_for(task_cfg))

    @staticmethod
    def config_from_dict(data: dict) -> LMConfig:
        """The model config saved by ``LMConfig.to_dict``."""
        return LMConfig.from_dict(data)

    def to_dict(self) -> dict:
        """What a checkpoint needs to rebuild this task: its tokenizer and, on a user's text,
        the record of the data and the sample prompts."""
        return self.data.to_dict()

    @classmethod
    def from_dict(cls, data: dict) -> LMTask:
        """Rebuild from ``to_dict``'s output."""
        return cls(data=text_data_from_dict(data))

    def run_files(self) -> dict[str, str]:
        """On a user's text: ``data.json`` (the data's record) and, for a BPE or a file's
        tokenizer, ``tokenizer.json`` (loadable with ``tokenizers.Tokenizer.from_file``);
        nothing for the bundled corpus."""
        return self.data.run_files()
