"""torchspeed.data: a prefetching DataLoader whose native sources run entirely in C++ threads.

    from torchspeed.data import DataLoader, WebDataset
    ds = WebDataset("train-{000000..000127}.tar", fields=("jpg;png", "cls"),
                    crop="random_resized_crop", size=224, flip_prob=0.5)
    loader = DataLoader(ds, batch_size=256, shuffle=True, num_workers=8, seed=0, device="cuda")
    for epoch in range(90):
        loader.set_epoch(epoch)
        for images, labels in loader:      # uint8 [256, 3, 224, 224] on the GPU, int64 [256]
            ...

An ordinary ``torch.utils.data.Dataset`` works too: it is delegated to torch's own DataLoader
(see :class:`DataLoader` for why), with ``device=`` prefetching added on top.
"""

from .loader import DataLoader
from .prefetch import DevicePrefetcher
from .sources import NpySource, TensorSource, WebDataset

__all__ = ["DataLoader", "WebDataset", "NpySource", "TensorSource", "DevicePrefetcher"]
