"""The built-in step hooks by name: the package's entry point of the group `stabexp.step_hooks`
(stabexp.plugins), in the order a run calls them at each moment: the divergence check first,
so that nothing acts on a step it ends, and before the checkpoint written on a request to stop.
Each is on where its config turns it on (`enabled`); another package's hooks, named in
train.hooks, come after them."""

from stabexp.train.checkpoint import Checkpoints
from stabexp.train.divergence import DivergenceCheck
from stabexp.train.qk_clip import QKClip

STEP_HOOKS = {"divergence": DivergenceCheck, "qk_clip": QKClip, "checkpoints": Checkpoints}
