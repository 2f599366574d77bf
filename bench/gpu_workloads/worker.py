"""A GPU job whose name says nothing: `hold` keeps memory resident and idles, `burn` saturates the SMs.

The real-GPU listing uses it to exercise the memory/utilisation rules of config/process-rules.toml.
"""

from __future__ import annotations

import sys
import time

import torch


def main() -> int:
    mode, gib, seconds = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    device = torch.device("cuda")
    resident = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if mode == "burn":
            for _ in range(20):
                a = torch.tanh(a @ a)
            torch.cuda.synchronize()
        else:
            (a[:64] @ a[:, :64]).sum().item()
            time.sleep(0.5)
    del resident
    return 0


if __name__ == "__main__":
    sys.exit(main())
