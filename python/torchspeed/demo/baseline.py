"""The baseline's input pipeline, written the way PyTorch's tutorials teach it: a map-style
``torch.utils.data.Dataset`` over the WebDataset shards (an index of (shard, offset, size, label)
built once by scanning the tars, each worker opening its own file handles), PIL decode and
torchvision-style transforms. torchvision is not a torchspeed dependency, so its transforms are
re-stated here on PIL and torch with torchvision's semantics (RandomResizedCrop's sampling,
PIL bilinear resizes with antialiasing, ToTensor's 0..1 float CHW, Normalize)."""

from __future__ import annotations

import io
import math
import tarfile
from typing import Callable, List, Sequence, Tuple

import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Compose:
    def __init__(self, transforms: Sequence[Callable]):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class RandomResizedCrop:
    """torchvision.transforms.RandomResizedCrop(size, scale, ratio) on a PIL image."""

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, img: Image.Image) -> Image.Image:
        W, H = img.size
        area = W * H
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= W and 0 < h <= H:
                i = int(torch.randint(0, H - h + 1, (1,)).item())
                j = int(torch.randint(0, W - w + 1, (1,)).item())
                break
        else:  # torchvision's fallback: the central crop at the nearest allowed ratio
            in_ratio = W / H
            if in_ratio < min(self.ratio):
                w, h = W, int(round(W / min(self.ratio)))
            elif in_ratio > max(self.ratio):
                h, w = H, int(round(H * max(self.ratio)))
            else:
                w, h = W, H
            i, j = (H - h) // 2, (W - w) // 2
        return img.crop((j, i, j + w, i + h)).resize((self.size, self.size), Image.BILINEAR)


class RandomHorizontalFlip:
    def __init__(self, p: float = 0.5):
        self.p = p

    def __call__(self, img: Image.Image) -> Image.Image:
        if torch.rand(1).item() < self.p:
            return img.transpose(Image.FLIP_LEFT_RIGHT)
        return img


class Resize:
    """torchvision.transforms.Resize(int): the shorter side to `size`, bilinear (antialiased)."""

    def __init__(self, size: int):
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        W, H = img.size
        if W <= H:
            w, h = self.size, int(self.size * H / W)
        else:
            h, w = self.size, int(self.size * W / H)
        return img.resize((w, h), Image.BILINEAR)


class CenterCrop:
    def __init__(self, size: int):
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        W, H = img.size
        top, left = int(round((H - self.size) / 2.0)), int(round((W - self.size) / 2.0))
        return img.crop((left, top, left + self.size, top + self.size))


class ToTensor:
    """PIL RGB -> float32 CHW in [0, 1]."""

    def __call__(self, img: Image.Image) -> torch.Tensor:
        x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8)
        return x.view(img.size[1], img.size[0], 3).permute(2, 0, 1).float().div_(255)


class Normalize:
    def __init__(self, mean=IMAGENET_MEAN, std=IMAGENET_STD):
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.sub_(self.mean).div_(self.std)


def train_transform(size: int, scale=(0.25, 1.0)) -> Compose:
    return Compose(
        [RandomResizedCrop(size, scale=scale), RandomHorizontalFlip(), ToTensor(), Normalize()]
    )


def eval_transform(size: int, resize_size: int) -> Compose:
    return Compose([Resize(resize_size), CenterCrop(size), ToTensor(), Normalize()])


class TarShardDataset(torch.utils.data.Dataset):
    """(image, label) samples of WebDataset shards (<key>.jpg + <key>.cls), read by offset."""

    def __init__(self, shards: Sequence[str], transform: Callable):
        self.transform = transform
        self.index: List[Tuple[int, int, int, int]] = []  # (shard, offset, size, label)
        self.shards = list(shards)
        for s, path in enumerate(self.shards):
            with tarfile.open(path) as tf:
                pending = {}
                for m in tf:
                    key, _, ext = m.name.partition(".")
                    entry = pending.setdefault(key, {})
                    if ext == "jpg":
                        entry["jpg"] = (m.offset_data, m.size)
                    elif ext == "cls":
                        entry["cls"] = int(tf.extractfile(m).read())
                    if "jpg" in entry and "cls" in entry:
                        self.index.append((s, *entry["jpg"], entry["cls"]))
                        del pending[key]
        self._files: dict = {}  # opened lazily, per worker process

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int):
        s, offset, size, label = self.index[i]
        f = self._files.get(s)
        if f is None:
            f = self._files[s] = open(self.shards[s], "rb")
        f.seek(offset)
        img = Image.open(io.BytesIO(f.read(size))).convert("RGB")
        return self.transform(img), label

    def __getstate__(self):  # worker processes open their own handles
        state = dict(self.__dict__)
        state["_files"] = {}
        return state
