"""How far each residual sublayer's weights have travelled from their initialisation:

    init_distance = ||W_t - W_0|| / ||W_0||   over the sublayer's weight matrices together,

at every probe step, in layers.csv. It is the reading behind DeepNet's account of Post-LN
without Post-LN-init (Wang et al. 2022, arXiv 2203.00555, v1 Sec. 3, Fig. 3(c) and 4(a)): the top
layers settle fast into a local minimum while the lower layers stay poorly trained; a layer that
has settled stops moving away from θ_0, a poorly trained one has moved little from it. The
per-step size of the same matrices' updates is `relative_update` (probes/layers.py).

The probe keeps a copy of the sublayers' weight matrices at init (the model's size again, in
the run's checkpoints too, so that a resumed run measures against the same θ_0).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from stabexp.distributed import local
from stabexp.probes import LayerProbe
from stabexp.probes.base import SUBLAYERS, SUM_OF_SQUARES, Probe, ProbeContext, Rows


class InitDistance(Probe):
    """probe.init_distance: each sublayer's ||W_t - W_0|| / ||W_0|| at the probe steps."""

    name = flag = "init_distance"
    needs = (SUBLAYERS,)
    # From the local shards, squared sums added over the ranks (one collective per probe step).
    combine = SUM_OF_SQUARES
    layers_columns = ("init_distance",)

    def __init__(self, ctx: ProbeContext):
        super().__init__(ctx)
        self.layer_probe = LayerProbe(ctx.adapter, reduce=ctx.reduce_sum if ctx.sharded else None)
        self.initial: Optional[List[torch.Tensor]] = None

    def _current(self) -> List[torch.Tensor]:
        return [local(p.detach()) for _, p in self.layer_probe.matrices]

    def at_init(self) -> None:
        if self.initial is None:  # a resumed run keeps the θ_0 its checkpoint holds
            self.initial = [w.clone() for w in self._current()]

    @torch.no_grad()
    def measure(self, step: int) -> Rows:
        probe, n = self.layer_probe, len(self.layer_probe.keys)
        if not probe.matrices:
            return Rows(sublayers=[{"init_distance": None} for _ in range(n)])
        current = self._current()
        moved = list(torch._foreach_sub(current, self.initial))
        owner = torch.cat([probe.matrix_owner, probe.matrix_owner + n])
        sums = probe.bucket_sums(moved + self.initial, owner, 2 * n)
        distance = (sums[:n] / sums[n:]).sqrt().tolist()
        return Rows(sublayers=[{"init_distance": d if d == d else None} for d in distance])

    def state_dict(self) -> Dict:
        return {"init_distance_initial": self.initial}

    def load_state_dict(self, state: Dict) -> None:
        if state.get("init_distance_initial") is not None:
            self.initial = [t.to(self.ctx.device) for t in state["init_distance_initial"]]
