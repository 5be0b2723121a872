"""A plain PyTorch training script, written the way many are (no torchspeed in it), for
`torchspeed doctor`:

    torchspeed doctor --steps 40 -- python examples/python/train_plain_torch.py --epochs 1

It has the usual flaws the doctor looks for: images decoded and augmented in the training process
(num_workers=0), a conv with a bias right before a BatchNorm, zero_grad(set_to_none=False).
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Random 3x64x64 "images" with a per-sample augmentation cost, like decode + transforms."""

    def __init__(self, n: int, work: int):
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        x = torch.rand(3, 64, 64, generator=g)
        for _ in range(self.work):  # stands in for JPEG decode + resize + flip
            x = (x * 0.9 + 0.05).clamp_(0, 1)
        return x, i % 10


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),  # bias=True before BatchNorm: wasted
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--work", type=int, default=40, help="augmentation passes per sample")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(SyntheticImages(args.samples, args.work), batch_size=args.batch_size,
                        shuffle=True, num_workers=args.workers)
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
