"""addnorm's version, in a module of its own so that what records it (``save_pretrained``'s
``config.json``) need not import the whole package."""

__version__ = "0.1.0"
