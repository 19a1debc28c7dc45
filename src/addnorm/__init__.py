"""addnorm: the Transformer and the Diffusion Transformer, part by part."""

__version__ = "0.1.0"
