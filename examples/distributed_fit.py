"""Data-parallel Model.fit on MPI: `python examples/distributed_fit.py` (one process) or
`mpiexec -n 2 python examples/distributed_fit.py` (two ranks, the same losses)."""
import numpy as np

import polygrad.distributed as dist
from polygrad import Model, Tensor, nn

dist.init()  # a plain `python train.py` is a world of one
net = nn.Linear(8, 2)
model = Model(lambda x: {"y": net(x)}, inputs={"x": Tensor.empty(16 // dist.world_size(), 8)},
              targets={"t": Tensor.empty(16 // dist.world_size(), 2)},
              loss=lambda out, t: (out["y"] - t).square().mean(), params=nn.state.get_parameters(net))
rng = np.random.default_rng(0)  # the same data on every rank: fit takes each rank's share
data = {"x": rng.standard_normal((64, 8)).astype(np.float32), "t": rng.standard_normal((64, 2)).astype(np.float32)}
losses = model.fit(data, epochs=3, batch_size=16, optimizer="adam", distributed=True, verbose=False)
model.save("model.pgb")  # rank 0 writes; the others return
if dist.is_main():
    print(f"{dist.world_size()} ranks, last loss {losses[-1]:.4f}, {dist.stats()['calls_per_step']} MPI call per step")
