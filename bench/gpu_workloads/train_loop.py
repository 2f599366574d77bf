"""A PyTorch training loop for the real-GPU process listing: an MLP on random data with AdamW."""

from __future__ import annotations

import sys

import torch


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    device = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(4096, 8192),
        torch.nn.GELU(),
        torch.nn.Linear(8192, 8192),
        torch.nn.GELU(),
        torch.nn.Linear(8192, 1000),
    ).to(device)
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(2048, 4096, device=device)
    y = torch.randint(0, 1000, (2048,), device=device)
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    steps = 0
    while True:
        optimiser.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimiser.step()
        steps += 1
        if steps % 50 == 0:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            if start.elapsed_time(end) / 1000 > seconds:
                return 0


if __name__ == "__main__":
    sys.exit(main())
