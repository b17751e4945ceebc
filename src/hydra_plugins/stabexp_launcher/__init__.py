"""stabexp's Hydra launcher `packed` (hydra/launcher=packed): a sweep's jobs several at a time
on one machine, each in a process of its own (stabexp.sweep). Hydra finds launchers in the
hydra_plugins namespace package; stabexp.config registers its config too."""
