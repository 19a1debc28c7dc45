"""The typed ``generate`` of the models that generate, written once for both.

:class:`GenerateEntry` gives :class:`~addnorm.transformer.lm.TransformerLM` and
:class:`~addnorm.transformer.encoder_decoder.Transformer` their ``generate`` method and
``generation_config``: the typed overloads (the return type follows
``return_dict_in_generate``) over the one :func:`~addnorm.generation.generate.generate`,
which reads the call, checks it once and runs the model's ``start`` and ``step``.

Each model names its own inputs (:class:`GenerateNames`): a decoder-only model its
``prompt_ids``, their ``padding_mask`` and a ``stop_fn``; an encoder-decoder its ``src_ids``
and ``src_padding_mask``. A name that is not the model's own is no keyword of it: it reaches
Hugging Face's settings, which refuse it by name (ValueError), as any unknown setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, overload

import torch

from addnorm.generation.config import GenerationConfig
from addnorm.generation.generate import default_config, generate, inputs_of
from addnorm.generation.hf_settings import TransformersSettings
from addnorm.generation.stop_strings import StopFn
from addnorm.transformer.embedding import id_tensor

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

    from addnorm.family import GenerationSpec
    from addnorm.generation.output import GenerateOutput

__all__ = ["GenerateEntry", "GenerateKeywords", "GenerateNames"]


class GenerateNames(NamedTuple):
    """A model's own keywords of ``generate``: its inputs, their padding mask (True =
    padding), and whether it takes a ``stop_fn``."""

    inputs: str
    padding_mask: str
    stop_fn: bool


class GenerateKeywords(TransformersSettings, total=False):
    """The keywords of ``generate`` beside its named parameters: Hugging Face's settings and
    the models' own names (each model takes its own, :class:`GenerateNames`)."""

    prompt_ids: torch.Tensor | None  # TransformerLM's inputs
    padding_mask: torch.Tensor | None  # TransformerLM's
    stop_fn: StopFn | None  # TransformerLM's
    src_ids: torch.Tensor | None  # Transformer's inputs
    src_padding_mask: torch.Tensor | None  # Transformer's


class GenerateEntry:
    """The ``generate`` method and ``generation_config`` of a model that implements
    :class:`~addnorm.family.GenerativeModel`, whose keywords are its ``generate_names``."""

    generate_names: ClassVar[GenerateNames]

    @property
    def generation_spec(self) -> GenerationSpec:  # the model's own
        raise NotImplementedError

    @property
    def generation_config(self) -> GenerationConfig:
        """The default of :meth:`generate`: greedy, 64 new tokens, stopping at the model's
        ``eos_id``. Variants: ``dataclasses.replace(model.generation_config, ...)``."""
        return default_config(self.generation_spec)

    @overload
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        /,
        config: GenerationConfig | None = None,
        *,
        input_ids: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        return_prompt: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config: None = None,
        return_dict_in_generate: Literal[False] | None = None,
        **settings: Unpack[GenerateKeywords],
    ) -> torch.Tensor: ...

    @overload
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        /,
        config: GenerationConfig | None = None,
        *,
        input_ids: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        return_prompt: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config: Any = None,
        return_dict_in_generate: Literal[True],
        **settings: Unpack[GenerateKeywords],
    ) -> GenerateOutput: ...

    @overload
    def generate(
        self,
        inputs: torch.Tensor | None = None,
        config: GenerationConfig | None = None,
        /,
        **settings: object,
    ) -> Any: ...

    # The last overload takes the config by position only and any keyword, so a keyword
    # named like it could reach both: mypy finds no implementation accepting that call, which
    # raises TypeError at run time.
    def generate(  # type: ignore[misc]
        self,
        inputs: torch.Tensor | None = None,
        /,
        config: GenerationConfig | None = None,
        *,
        input_ids: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        return_prompt: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config: Any = None,
        return_dict_in_generate: bool | None = None,
        **settings: Any,
    ) -> torch.Tensor | GenerateOutput:
        """Continue each prompt (decoder-only) or decode each source (encoder-decoder) as
        ``config`` says (default :attr:`generation_config`), or as Hugging Face's
        ``generate`` would.

        addnorm's call, ``generate(inputs, config, padding_mask=..., generator=...)`` (an
        encoder-decoder's: ``src_padding_mask=``), returns the new tokens only; after a
        row's stop token they hold ``config.fill_id``. The model's ``pad_id`` (and an
        encoder-decoder's ``bos_id``) is never generated, so neither may be a stop token.
        ``generator`` is used by sampling. A decoder-only model's prompt is left-padded,
        each row continued after its last token, which must be real (a row of padding only
        is refused); it counts as seen for the repetition rules (padding excluded), and
        ``stop_fn`` ends rows early, e.g. at stop strings
        (:func:`~addnorm.generation.stop_strings.stop_at_strings`). An encoder-decoder
        decodes a source row of padding only from an empty memory, as its forward does.

        Hugging Face's call: ``input_ids`` (the inputs by transformers' name),
        ``attention_mask`` (1 = real token; give it or the padding mask),
        ``generation_config``, ``return_dict_in_generate`` and the settings of
        :class:`~addnorm.generation.hf_settings.TransformersSettings`, with transformers'
        meaning and defaults; it returns the prompt (an encoder-decoder's ``bos_id``)
        followed by the new tokens, or a :class:`~addnorm.generation.output.GenerateOutput`.
        Which names are accepted, at which values, and how they are read:
        :func:`~addnorm.generation.transformers_call.transformers_call` and
        ``docs/design.md`` ("generate"). ``return_prompt`` chooses either way (None: False
        for addnorm's call, True for Hugging Face's). With ``num_return_sequences`` r, rows
        ``b * r .. b * r + r - 1`` continue row ``b``. Settings passed as ``**settings``
        from a dict that is no :class:`GenerateKeywords` are accepted too; the result is
        then typed ``Any`` (the dict may ask for ``return_dict_in_generate``).

        Shapes:
            inputs, input_ids: (B, L0); padding_mask, attention_mask: (B, L0)
            returns: (B * r, N), N <= max_new_tokens; (B * r, L0 + N) with a prompt,
            (B * r, 1 + N) with ``bos_id``
        """
        names = self.generate_names
        if names.inputs in settings:  # the inputs by the model's name for them
            if inputs is not None:
                raise TypeError(f"{type(self).__name__}.generate() got multiple values for "
                                f"argument {names.inputs!r}")
            inputs = settings.pop(names.inputs)
        padding_mask = settings.pop(names.padding_mask, None)
        stop_fn = settings.pop("stop_fn", None) if names.stop_fn else None
        ids, by_name = inputs_of(names.inputs, inputs, input_ids)
        return generate(
            self,  # type: ignore[arg-type]  # a GenerativeModel: the model's start and step
            id_tensor("input_ids" if by_name else names.inputs, ids, None), config,
            padding_mask=padding_mask, generator=generator, stop_fn=stop_fn,
            return_prompt=return_prompt, attention_mask=attention_mask,
            generation_config=generation_config, inputs_by_name=by_name,
            settings={**settings, "return_dict_in_generate": return_dict_in_generate},
        )
