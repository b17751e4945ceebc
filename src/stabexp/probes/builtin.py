"""The package's own probes, by name: the entry point of the `stabexp.probes` group
(pyproject.toml), as another package registers its own. Their order is the order in which a run
calls them and merges their rows (a later probe's cells win: the at-init gradient over the
step-0 row's empty one)."""

from stabexp.probes.at_init import AtInit
from stabexp.probes.attention_mixing import AttentionMixing
from stabexp.probes.dependency import Dependency
from stabexp.probes.init_distance import InitDistance
from stabexp.probes.layer_importance import LayerImportance
from stabexp.probes.layers import SublayerStats
from stabexp.probes.update_bound import UpdateBoundProbe
from stabexp.probes.weights import Weights

PROBES = {probe.name: probe for probe in (SublayerStats, AtInit, Weights, UpdateBoundProbe, Dependency,
                                          LayerImportance, AttentionMixing, InitDistance)}
