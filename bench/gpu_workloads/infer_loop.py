"""A PyTorch inference loop for the real-GPU process listing: batched forward passes, with pauses."""

from __future__ import annotations

import sys
import time

import torch


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 120.0
    device = torch.device("cuda")
    model = (
        torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048))
        .to(device)
        .half()
        .eval()
    )
    deadline = time.monotonic() + seconds
    with torch.inference_mode():
        while time.monotonic() < deadline:
            batch = torch.randn(256, 2048, device=device, dtype=torch.half)
            model(batch).argmax(dim=1).cpu()  # a request's answer goes back to the host
            time.sleep(0.005)  # requests arrive with gaps, as a server's do
    return 0


if __name__ == "__main__":
    sys.exit(main())
