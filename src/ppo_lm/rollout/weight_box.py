"""How the learner hands its weights to an asynchronous producer's process (docs/async.md): one version
of the trainable parameters — all of them in full fine-tuning, the adapters alone with LoRA — in
memory both processes map. The learner writes a version once the producer has copied the previous
one out; the producer copies it into its own model when an iteration needs it. So the box and the
producer's model are the two buffers of a double-buffered publish: the learner never waits for the
producer to finish sampling with the old weights, only (rarely) for it to copy them.

The memory is a file in /dev/shm (the system's temporary folder where there is none), removed as soon
as both processes have mapped it: nothing is left behind, however either ends.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

_ALIGN = 64  # bytes: every parameter's slice starts on a cache line (and on its dtype's alignment)


@dataclass(frozen=True)
class BoxLayout:
    """Where each parameter lies in the box: ``names`` in the model's ``named_parameters`` order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[torch.dtype, ...]
    offsets: tuple[int, ...]
    nbytes: int

    @classmethod
    def of(cls, params: list[tuple[str, Tensor]]) -> BoxLayout:
        offsets, at = [], 0
        for _, p in params:
            offsets.append(at)
            at += -(-p.numel() * p.element_size() // _ALIGN) * _ALIGN
        return cls(tuple(n for n, _ in params), tuple(tuple(p.shape) for _, p in params),
                   tuple(p.dtype for _, p in params), tuple(offsets), max(at, _ALIGN))


class WeightBox:
    """The mapped memory of ``layout`` at ``path``; :meth:`create` on the learner's side,
    :meth:`attach` on the producer's."""

    def __init__(self, path: str, layout: BoxLayout):
        self.path, self.layout = path, layout
        raw = torch.from_file(path, shared=True, size=layout.nbytes, dtype=torch.uint8)
        self.views = [raw[o: o + _size(s, d)].view(d).view(s)
                      for s, d, o in zip(layout.shapes, layout.dtypes, layout.offsets)]

    @classmethod
    def create(cls, params: list[tuple[str, Tensor]]) -> WeightBox:
        """A box for ``params`` holding their values now."""
        layout = BoxLayout.of(params)
        folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        fd, path = tempfile.mkstemp(prefix="ppo-lm-weights-", dir=folder)
        try:
            os.ftruncate(fd, layout.nbytes)
        finally:
            os.close(fd)
        box = cls(path, layout)
        box.write([p for _, p in params])
        return box

    @classmethod
    def attach(cls, path: str, layout: BoxLayout) -> WeightBox:
        return cls(path, layout)

    @torch.no_grad()
    def write(self, tensors: list[Tensor]) -> None:
        for view, t in zip(self.views, tensors, strict=True):
            view.copy_(t.detach())

    @torch.no_grad()
    def read_into(self, tensors: list[Tensor]) -> None:
        for view, t in zip(self.views, tensors, strict=True):
            t.copy_(view)

    def unlink(self) -> None:
        """Remove the file; the memory stays mapped for as long as either side holds it."""
        Path(self.path).unlink(missing_ok=True)


def _size(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()
