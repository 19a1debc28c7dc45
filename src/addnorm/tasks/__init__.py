"""Tasks that train the models on data that ships with the install: ``translate`` (dates) and
``lm`` (characters), and the run orchestration (``run``) behind ``addnorm train``."""
