# The Python side of the launch-latency comparison: what a torchrun worker must do before it can
# train (import torch, join the gloo group, pass a barrier).
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print("READY %.6f" % time.monotonic(), flush=True)
dist.destroy_process_group()
