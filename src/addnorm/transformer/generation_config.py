"""``GenerationConfig``: how a decoder picks its next tokens (greedy, sampling, beam search),
frozen and validated on construction; ``from_transformers`` reads Hugging Face's names.

The decoding loops that follow it are :mod:`addnorm.transformer.generation` (greedy and
sampling) and :mod:`addnorm.transformer.beam_search`.
"""

from __future__ import annotations

from dataclasses import dataclass

from addnorm._checks import check_bool, check_choice, check_float, check_int

__all__ = ["STRATEGIES", "GenerationConfig"]

STRATEGIES = ("greedy", "sample", "beam")


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
            ``_divide_by_temperature`` of :mod:`addnorm.transformer.generation`). 0 itself is
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
            generations, most at batch 1 on the CPU, where the step's one-row products
            become fused kernels (see :func:`addnorm.transformer.decoding.compiled_step`;
            benchmarks/compiled_decoding.py prints the compile time and the speed-up). The
            tokens are those of eager decoding (up to floating-point rounding).
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
        if isinstance(self.eos_id, list):
            object.__setattr__(self, "eos_id", tuple(self.eos_id))
        _check_eos_id(self.eos_id)
        defaults = {"temperature": 1.0, "top_k": None, "top_p": None}
        used = [f"{n}={getattr(self, n)!r}" for n, d in defaults.items() if getattr(self, n) != d]
        if self.strategy != "sample" and used:
            raise ValueError(
                f"{', '.join(used)} only apply to strategy='sample', "
                f"got strategy={self.strategy!r}"
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
    def reshapes_logits(self) -> bool:
        """Whether ``repetition_penalty`` or ``no_repeat_ngram_size`` is in effect."""
        return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0

    @classmethod
    def from_transformers(
        cls,
        *,
        do_sample: bool = False,
        num_beams: int = 1,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        length_penalty: float = 1.0,
        repetition_penalty: float = 1.0,
        no_repeat_ngram_size: int = 0,
        eos_token_id: int | list[int] | tuple[int, ...] | None = None,
        pad_token_id: int | None = None,
        compile: bool = False,
    ) -> GenerationConfig:
        """A config from the argument names of Hugging Face's ``generate``.

        The mapping: ``do_sample=False, num_beams=1`` is ``strategy="greedy"``;
        ``do_sample=True, num_beams=1`` is ``"sample"``; ``do_sample=False, num_beams=K > 1``
        is ``"beam"`` with ``num_beams=K``. ``eos_token_id`` is ``eos_id``, ``pad_token_id``
        is ``pad_id``; every other name is the field of the same name, with the same meaning.
        Two differences: ``top_k`` defaults to None (Hugging Face's ``GenerationConfig``
        defaults to 50; pass ``top_k=50`` for its sampling), and settings that do not apply
        to the strategy (``temperature`` without sampling) raise instead of being ignored
        with a warning. A model's ``generate`` needs its own pad id::

            GenerationConfig.from_transformers(do_sample=True, top_p=0.9,
                eos_token_id=model.cfg.eos_id, pad_token_id=model.cfg.pad_id)
        """
        check_bool("do_sample", do_sample)
        check_int("num_beams", num_beams, min_value=1)
        if do_sample and num_beams > 1:
            raise ValueError(
                f"do_sample=True with num_beams={num_beams} (beam sampling) is not supported; "
                "use do_sample=True with num_beams=1, or do_sample=False for beam search"
            )
        strategy = "beam" if num_beams > 1 else "sample" if do_sample else "greedy"
        beams = {"num_beams": num_beams} if strategy == "beam" else {}
        if isinstance(eos_token_id, list):
            eos_token_id = tuple(eos_token_id)
        return cls(
            max_new_tokens=max_new_tokens, strategy=strategy, temperature=temperature,
            top_k=top_k, top_p=top_p, length_penalty=length_penalty,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            eos_id=eos_token_id, pad_id=pad_token_id, compile=compile, **beams,
        )


def _check_eos_id(eos_id: object) -> None:
    """An int >= 0, a non-empty tuple of them, or None."""
    if isinstance(eos_id, tuple):
        if not eos_id:
            raise ValueError("eos_id must be an int, a non-empty tuple of ints or None, got ()")
        for i, stop in enumerate(eos_id):
            check_int(f"eos_id[{i}]", stop, min_value=0)
    elif eos_id is not None:
        check_int("eos_id", eos_id, min_value=0)
