"""Tasks that train the models: the ``Task`` protocol and ``TaskConfig`` (``task``), the
registry of tasks by name (``registry``: ``register_task`` adds one), and the three that train
on data that ships with the install: ``translate`` (dates on the encoder-decoder), ``lm``
(characters on the decoder-only LM) and ``dit`` (scikit-learn's digits on the DiT, judged by
``digit_quality``); ``plan`` (what a run is before anything is built: its configs from
defaults, a preset, a config file and overrides, or from a checkpoint to resume, and whether
it fits a device's memory); ``run`` (a run start to finish, and loading a trained model back),
behind ``addnorm train``; and ``loading`` (``addnorm.load``). Nothing but a task's own module
names a task: ``plan``, ``run`` and the CLI call the protocol's hooks."""
