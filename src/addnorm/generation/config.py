"""``GenerationConfig``: how a decoder picks its next tokens (greedy, sampling, beam search),
frozen and validated on construction; ``from_transformers`` reads Hugging Face's names
(:mod:`addnorm.generation.hf_settings` maps them; :mod:`addnorm.generation.transformers_call`
reads a whole ``generate`` call made with them).

The decoding loops that follow a config are :mod:`addnorm.generation.loop` (greedy and
sampling) and :mod:`addnorm.generation.beam_search`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from addnorm.generation.hf_settings import fields_from_transformers
from addnorm.utils.checks import check_bool, check_choice, check_float, check_int

if TYPE_CHECKING:
    pass

__all__ = [
    "BEAM_STOPS",
    "STRATEGIES",
    "GenerationConfig",
    "transformers_settings",
]

STRATEGIES = ("greedy", "sample", "beam")
# When beam search stops; Hugging Face's early_stopping="never", False and True, in order.
BEAM_STOPS = ("exact", "heuristic", "k_finished")



@dataclass(frozen=True)
class GenerationConfig:
    """How to pick the next tokens; validated on construction.

    Attributes:
        max_new_tokens: the most tokens generated per row (>= 1).
        strategy: ``"greedy"`` (argmax; ties go to the lowest token id), ``"sample"`` (draw
            from the softmax, shaped by ``temperature``, ``top_k``, ``top_p``) or ``"beam"``.
        temperature: sampling only; logits are divided by it: any float > 0, subnormal ones
            included. The division is done on the logits minus their row maximum (softmax
            does not change), so nothing overflows into NaN: a tiny temperature sends every
            non-maximal logit to -inf, which is the limit T -> 0 (uniform over the argmax set;
            ``divide_by_temperature`` of :mod:`addnorm.generation.sampling`). 0 itself is
            refused: use ``strategy="greedy"``.
        top_k: sampling only; keep the ``top_k`` largest logits (applied after temperature).
        top_p: sampling only; nucleus: keep the smallest set of most likely tokens whose
            probability (after temperature and top-k) sums to >= ``top_p``, never fewer than
            one token (Hugging Face's ``min_tokens_to_keep=1``, so a tiny ``top_p`` is greedy).
            In (0, 1].
        num_beams: beam search only; the beam width K (>= 1).
        length_penalty: beam search only; a hypothesis of n generated tokens (its stop token
            included) scores ``sum of token log-probs / n ** length_penalty``. 0 ranks by the
            plain log-probability; larger values favour longer outputs.
        repetition_penalty: > 0; every token already seen (prompt or generated) has its logit
            divided by it when positive and multiplied by it when negative (CTRL's rule, as
            Hugging Face applies it); 1.0 changes nothing, > 1 discourages repeats.
        no_repeat_ngram_size: n >= 0; a token that would complete an n-gram already seen is
            never picked (0 turns the rule off). If it leaves a row no token, greedy and
            sampling raise ValueError naming the row.
        eos_id: a stop token id, a tuple of them, or None (rows end only at max_new_tokens).
        pad_id: the id written after a row's stop token; None (a vocabulary without padding,
            GPT-2's) writes the first stop id instead (see :attr:`fill_id`).
        compile: run the model's cached ``step`` compiled (``torch.compile(fullgraph=True)``)
            over a cache in the static layout (see :mod:`addnorm.cache`): the first call
            pays the compile (less once inductor's disk cache holds the kernels), later
            steps and calls with the same shapes reuse it. It pays off for long or repeated
            generations, most at batch 1: on the CPU the step's one-row products become
            fused kernels, on CUDA a step is one CUDA graph replay (see
            :func:`addnorm.generation.step.compiled_step`; the model then keeps the step's
            cache buffers between calls; benchmarks/compiled_decoding.py prints the compile
            time and the speed-up). The tokens are those of eager decoding (up to
            floating-point rounding).
        min_new_tokens: n >= 0; the stop tokens (``eos_id``) are never picked before a row
            has n new tokens (Hugging Face's ``min_new_tokens``: their logits are -inf until
            then). More than ``max_new_tokens`` just means no row stops at a stop token.
        num_return_sequences: r >= 1 output rows per input row, grouped by input row (rows
            ``b * r .. b * r + r - 1`` continue row ``b``): r independent samples
            (``"sample"``), or the r best hypotheses, best first (``"beam"``, r <=
            ``num_beams``). Greedy decoding refuses r > 1 (every row would be the same).
        beam_stop: beam search only; when a row stops searching (see
            :func:`addnorm.generation.beam_search.beam_search`). ``"exact"``: once no live
            beam can still beat its ``num_beams``-th finished hypothesis (Hugging Face's
            ``early_stopping="never"``); ``"heuristic"``: once the best live beam, scored at
            its current length, does not beat it (``early_stopping=False``, Hugging Face's
            default); ``"k_finished"``: as soon as ``num_beams`` hypotheses have finished
            (``early_stopping=True``).
        min_p: sampling only; keep the tokens whose probability (after temperature, top-k
            and top-p) is at least ``min_p`` times the likeliest token's, never fewer than
            one (Hugging Face's ``MinPLogitsWarper``). In (0, 1]; None switches it off.
        bad_words_ids: token sequences never generated (Hugging Face's
            ``NoBadWordsLogitsProcessor``): a sequence of one token bans that token at every
            step, unless it is a stop id (a row must be able to stop); a longer one bans its
            last token wherever the row's history (prompt, padding excluded, then the new
            tokens) ends with the rest of it.
        suppress_tokens: ids never generated (their logits -inf at every step).
        forced_eos_id: an id, or a tuple of them, that every row still live emits as its
            ``max_new_tokens``-th token (Hugging Face's ``forced_eos_token_id``: the logits of
            that step are -inf but for these ids, which get 0).
        max_time: seconds; once this much time has passed since ``generate`` was called,
            every row ends after its current token (Hugging Face's ``max_time``). The clock
            is read on the host after each step's stop check, so it adds no device read
            (:func:`addnorm.generation.loop.decode`). None: no limit.
        window: a decoder-only model sees at most this many tokens at once; past them its
            window slides (:mod:`addnorm.generation.window`). None: the model's trained
            context (``TransformerLM.context``). More than that asks for positions the model
            never trained on. Hugging Face's ``generate`` has no such setting (its models
            refuse or extrapolate past their positions); Mistral's ``sliding_window`` is the
            model's attention span, not this.
        window_stride: how many tokens the window moves by: once it is full, the next token
            recomputes the last ``window - window_stride`` tokens with it, so each token is
            predicted from ``window - window_stride + 1`` to ``window`` tokens; 1 recomputes
            the whole window per token (nanoGPT's ``generate``). None: a quarter of the
            window (:func:`~addnorm.generation.window.default_stride`).
    """

    max_new_tokens: int = 64
    strategy: str = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 4
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    eos_id: int | tuple[int, ...] | None = None
    pad_id: int | None = 0
    compile: bool = False
    min_new_tokens: int = 0
    num_return_sequences: int = 1
    beam_stop: str = "exact"
    min_p: float | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    suppress_tokens: tuple[int, ...] = ()
    forced_eos_id: int | tuple[int, ...] | None = None
    max_time: float | None = None
    window: int | None = None
    window_stride: int | None = None

    def __post_init__(self) -> None:
        check_int("max_new_tokens", self.max_new_tokens, min_value=1)
        check_choice("strategy", self.strategy, STRATEGIES)
        if isinstance(self.temperature, int | float) and self.temperature == 0:
            raise ValueError(
                "temperature must be > 0, got 0; for deterministic argmax decoding use "
                'strategy="greedy"'
            )
        check_float("temperature", self.temperature, min_value=0.0, min_inclusive=False)
        if self.top_k is not None:
            check_int("top_k", self.top_k, min_value=1)
        if self.top_p is not None:
            check_float("top_p", self.top_p, min_value=0.0, min_inclusive=False, max_value=1.0)
        check_int("num_beams", self.num_beams, min_value=1)
        check_float("length_penalty", self.length_penalty)
        check_float("repetition_penalty", self.repetition_penalty, min_value=0.0,
                    min_inclusive=False)
        check_int("no_repeat_ngram_size", self.no_repeat_ngram_size, min_value=0)
        if self.pad_id is not None:
            check_int("pad_id", self.pad_id, min_value=0)
        check_bool("compile", self.compile)
        check_int("min_new_tokens", self.min_new_tokens, min_value=0)
        check_int("num_return_sequences", self.num_return_sequences, min_value=1)
        check_choice("beam_stop", self.beam_stop, BEAM_STOPS)
        self._check_return_sequences()
        for name in ("eos_id", "forced_eos_id"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
            _check_eos_id(name, getattr(self, name))
        if self.min_p is not None:
            check_float("min_p", self.min_p, min_value=0.0, min_inclusive=False, max_value=1.0)
        object.__setattr__(self, "bad_words_ids", _id_sequences("bad_words_ids",
                                                                self.bad_words_ids))
        object.__setattr__(self, "suppress_tokens", _ids("suppress_tokens", self.suppress_tokens))
        if self.max_time is not None:
            check_float("max_time", self.max_time, min_value=0.0, min_inclusive=False)
        for name in ("window", "window_stride"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), min_value=1)
        if self.window is not None and self.window_stride is not None and (
                self.window_stride > self.window):
            raise ValueError(f"window_stride ({self.window_stride}) must be <= window "
                             f"({self.window})")
        if self.forced_ids and set(self.forced_ids) <= set(self.suppress_tokens):
            raise ValueError(
                f"every id of forced_eos_id {self.forced_eos_id!r} is also in suppress_tokens: "
                "the last step would have no token left (transformers refuses this too)"
            )
        defaults = {"temperature": 1.0, "top_k": None, "top_p": None, "min_p": None}
        used = [f"{n}={getattr(self, n)!r}" for n, d in defaults.items() if getattr(self, n) != d]
        if self.strategy != "sample" and used:
            raise ValueError(
                f"{', '.join(used)} only apply to strategy='sample', "
                f"got strategy={self.strategy!r}"
            )

    def _check_return_sequences(self) -> None:
        rows = self.num_return_sequences
        if rows > 1 and self.strategy == "greedy":
            raise ValueError(
                f"num_return_sequences={rows} needs strategy='sample' or 'beam': greedy "
                "decoding would return the same row every time"
            )
        if self.strategy == "beam" and rows > self.num_beams:
            raise ValueError(
                f"num_return_sequences ({rows}) must be <= num_beams ({self.num_beams}): beam "
                "search returns each row's best finished hypotheses"
            )

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The stop token ids as a tuple (empty when ``eos_id`` is None)."""
        if self.eos_id is None:
            return ()
        return self.eos_id if isinstance(self.eos_id, tuple) else (self.eos_id,)

    @property
    def fill_id(self) -> int | None:
        """The id written after a row ends: ``pad_id``, else the first stop id (Hugging
        Face's rule when ``pad_token_id`` is None), else None (rows then never end early)."""
        if self.pad_id is not None:
            return self.pad_id
        return self.stop_ids[0] if self.stop_ids else None

    @property
    def forced_ids(self) -> tuple[int, ...]:
        """``forced_eos_id`` as a tuple (empty when it is None)."""
        if self.forced_eos_id is None:
            return ()
        return self.forced_eos_id if isinstance(self.forced_eos_id, tuple) else (
            self.forced_eos_id,)

    @property
    def reshapes_logits(self) -> bool:
        """Whether a rule that reads the row's history is in effect: ``repetition_penalty``,
        ``no_repeat_ngram_size``, or a ``bad_words_ids`` sequence of several tokens."""
        return (self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0
                or any(len(words) > 1 for words in self.bad_words_ids))

    @property
    def has_logit_rules(self) -> bool:
        """Whether any rule reshapes the logits before a token is picked (the history rules,
        ``min_new_tokens``, ``bad_words_ids``, ``suppress_tokens``, ``forced_eos_id``)."""
        return (self.reshapes_logits or self.min_new_tokens > 0 or bool(self.bad_words_ids)
                or bool(self.suppress_tokens) or self.forced_eos_id is not None)

    @classmethod
    def from_transformers(
        cls,
        settings: object = None,
        /,
        *,
        prompt_length: int | None = None,
        compile: bool = False,
        **names: Any,
    ) -> GenerationConfig:
        """A config from Hugging Face's generation settings, with Hugging Face's meaning.

        ``settings``: a ``transformers.GenerationConfig``, or a mapping such as its
        ``to_diff_dict()``; ``names``: the same names as keywords, which win over
        ``settings`` (as ``generate``'s keywords win over its ``generation_config``). None
        means unset, as in transformers; an unset name takes Hugging Face's default.
        ``GenerationConfig.from_transformers(**hf_config.to_diff_dict())`` works too.

        The mapping (Hugging Face -> addnorm):

        - ``do_sample=False, num_beams=1`` -> ``strategy="greedy"``; ``do_sample=True,
          num_beams=1`` -> ``"sample"``; ``do_sample=False, num_beams=K > 1`` -> ``"beam"``
          with ``num_beams=K``. Beam sampling (both) is refused.
        - ``max_new_tokens`` -> ``max_new_tokens`` (default 20, transformers 5's). Else
          ``max_length``, which counts the prompt: ``max_new_tokens = max_length -
          prompt_length`` (``prompt_length``: a decoder-only model's prompt, padding
          included; 1, the start token, for an encoder-decoder). ``max_new_tokens`` wins when
          both are set, as in transformers.
        - ``min_new_tokens`` -> ``min_new_tokens``; else ``min_length`` - ``prompt_length``.
        - ``temperature``, ``top_k`` (default 50; 0 switches it off), ``top_p`` (1.0: off),
          ``min_p`` (0 or None: off): sampling only. Without ``do_sample=True`` these, and
          Hugging Face's other sampling-only settings (``typical_p``, ...), are ignored with
          a UserWarning naming those set to a value other than their default, as transformers
          ignores them (its ``GenerationConfig.validate`` warns).
        - ``early_stopping`` (beam search) -> ``beam_stop``: False (the default) ->
          ``"heuristic"``, True -> ``"k_finished"``, ``"never"`` -> ``"exact"``.
        - ``eos_token_id`` (an int or a list) -> ``eos_id``; ``pad_token_id`` -> ``pad_id``;
          ``forced_eos_token_id`` -> ``forced_eos_id``; ``repetition_penalty``,
          ``no_repeat_ngram_size``, ``length_penalty``, ``num_return_sequences``,
          ``bad_words_ids``, ``suppress_tokens``, ``max_time``: the field of the same name.

        Ignored, as they never change the tokens: ``transformers_version``,
        ``_from_model_config`` and other metadata, ``use_cache``, ``bos_token_id`` and
        ``decoder_start_token_id`` (the first decoder token is the model's; an
        encoder-decoder's ``generate`` checks them against its ``bos_id``),
        ``return_dict_in_generate``, ``output_scores`` and ``output_logits`` (what a model's
        ``generate`` returns: :func:`transformers_call` reads them). Settings addnorm
        does not implement (``typical_p``, ``output_attentions``, ``num_beam_groups``, ...) are
        accepted only at the value that switches them off; any other value, and any unknown
        name, raises a ValueError naming them all. A model's ``generate`` takes these names
        directly (with its own eos and pad ids as the defaults)::

            GenerationConfig.from_transformers(do_sample=True, top_p=0.9,
                eos_token_id=model.cfg.eos_id, pad_token_id=model.cfg.pad_id)
        """
        given = transformers_settings(settings)
        given.update((name, value) for name, value in names.items() if value is not None)
        if prompt_length is not None:
            check_int("prompt_length", prompt_length, min_value=0)
        check_bool("compile", compile)
        return cls(**fields_from_transformers(given, prompt_length), compile=compile)


def transformers_settings(settings: object) -> dict[str, Any]:
    """Hugging Face's generation settings as a dict of the names that are set (not None):
    from a ``transformers.GenerationConfig`` (its ``to_diff_dict()``), a mapping, or None."""
    if settings is None:
        return {}
    if isinstance(settings, GenerationConfig):
        raise TypeError(
            "this is addnorm's GenerationConfig; pass it as generate's config, not as Hugging "
            "Face's generation_config"
        )
    to_diff_dict = getattr(settings, "to_diff_dict", None)
    if callable(to_diff_dict):
        settings = to_diff_dict()
    if not isinstance(settings, Mapping):
        raise TypeError(
            "Hugging Face's generation settings must be a transformers.GenerationConfig or a "
            f"mapping of its names (to_diff_dict()), got {type(settings).__name__}"
        )
    for name in settings:
        if not isinstance(name, str):
            raise TypeError(f"generation setting names must be strings, got {name!r}")
    return {name: value for name, value in settings.items() if value is not None}


def _check_eos_id(name: str, eos_id: object) -> None:
    """An int >= 0, a non-empty tuple of them, or None."""
    if isinstance(eos_id, tuple):
        if not eos_id:
            raise ValueError(f"{name} must be an int, a non-empty tuple of ints or None, got ()")
        for i, stop in enumerate(eos_id):
            check_int(f"{name}[{i}]", stop, min_value=0)
    elif eos_id is not None:
        check_int(name, eos_id, min_value=0)


def _ids(name: str, ids: object) -> tuple[int, ...]:
    """A sequence of token ids >= 0 as a tuple (a bare string or int is refused)."""
    if isinstance(ids, str | bytes) or not isinstance(ids, Sequence):
        raise TypeError(f"{name} must be a sequence of token ids, got {ids!r}")
    return tuple(check_int(f"{name}[{i}]", token, min_value=0) for i, token in enumerate(ids))


def _id_sequences(name: str, sequences: object) -> tuple[tuple[int, ...], ...]:
    """A sequence of non-empty sequences of token ids, as tuples."""
    if isinstance(sequences, str | bytes) or not isinstance(sequences, Sequence):
        raise TypeError(f"{name} must be a sequence of token id sequences, got {sequences!r}")
    checked = tuple(_ids(f"{name}[{i}]", words) for i, words in enumerate(sequences))
    for i, words in enumerate(checked):
        if not words:
            raise ValueError(f"{name}[{i}] must hold at least one token id, got an empty one")
    return checked
