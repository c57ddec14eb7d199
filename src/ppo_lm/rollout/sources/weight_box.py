"""How the learner hands its weights to an asynchronous producer's process (docs/async.md): one version
of the trainable parameters — all of them in full fine-tuning, the adapters alone with LoRA — in
memory both processes map. The learner writes a version once the producer has copied the previous
one out; the producer copies it into its own model when an iteration needs it. So the box and the
producer's model are the two buffers of a double-buffered publish: the learner never waits for the
producer to finish sampling with the old weights, only (rarely) for it to copy them.

The memory has no name: an anonymous memory file (``memfd_create``), or with ``rollout.weight_box_dir``
(or where the system has no memfd) a file removed the moment it is opened. The producer inherits its
descriptor, so nothing is left behind, however either process ends — a SIGKILL at any moment included.
The whole size is reserved before the first write: a box that does not fit fails with one line
rather than a SIGBUS on a later write.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
from dataclasses import dataclass

import torch
from torch import Tensor

from ...runtime.errors import UserError

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


class BoxTooLarge(UserError):
    """The weight box does not fit in the memory or the folder it goes in."""


class WeightBox:
    """The mapped memory of ``layout`` behind the descriptor ``fd``; :meth:`create` on the learner's side,
    :meth:`attach` on the producer's (``fd`` inherited from the learner)."""

    def __init__(self, fd: int, layout: BoxLayout):
        self.fd, self.layout = fd, layout
        self._map = mmap.mmap(fd, layout.nbytes)
        raw = torch.frombuffer(self._map, dtype=torch.uint8)
        self.views = [raw[o: o + _size(s, d)].view(d).view(s)
                      for s, d, o in zip(layout.shapes, layout.dtypes, layout.offsets)]

    @classmethod
    def create(cls, params: list[tuple[str, Tensor]], folder: str | None = None) -> WeightBox:
        """A box for ``params`` holding their values now: anonymous memory, or a file in ``folder``
        (removed at once)."""
        layout = BoxLayout.of(params)
        fd, where = _anonymous() if folder is None and hasattr(os, "memfd_create") else _unlinked_file(folder)
        try:
            _reserve(fd, layout.nbytes, where)
            box = cls(fd, layout)
        except BaseException:
            os.close(fd)
            raise
        box.write([p for _, p in params])
        return box

    @classmethod
    def attach(cls, fd: int, layout: BoxLayout) -> WeightBox:
        return cls(fd, layout)

    @torch.no_grad()
    def write(self, tensors: list[Tensor]) -> None:
        for view, t in zip(self.views, tensors, strict=True):
            view.copy_(t.detach())

    @torch.no_grad()
    def read_into(self, tensors: list[Tensor]) -> None:
        for view, t in zip(self.views, tensors, strict=True):
            t.copy_(view)

    def close_fd(self) -> None:
        """Close the descriptor once the producer holds its own: the mapping stays for as long as either maps it."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _anonymous() -> tuple[int, str]:
    return os.memfd_create("ppo-lm-weights", os.MFD_CLOEXEC), "memory"


def _unlinked_file(folder: str | None) -> tuple[int, str]:
    if folder is None:
        folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    fd, path = tempfile.mkstemp(prefix="ppo-lm-weights-", dir=folder)
    os.unlink(path)  # gone from the folder before anything else can happen; the descriptor keeps the file
    return fd, folder


def _reserve(fd: int, nbytes: int, where: str) -> None:
    """Allocate all ``nbytes`` now (a tmpfs such as /dev/shm otherwise fails at a later write with SIGBUS),
    after checking a folder's free space; one line naming the fix where it does not fit."""
    mb = nbytes / 2**20
    disk = "set `rollout.weight_box_dir` to a folder on disk (a file-backed box)"
    fix = disk if where == "memory" else f"give the container more shared memory (`docker run --shm-size=...`), or {disk}"
    if where != "memory":
        st = os.statvfs(where)
        free = st.f_bavail * st.f_frsize
        if free < nbytes:
            raise BoxTooLarge(f"the asynchronous producer's weight box needs {mb:.0f} MB and {where} has "
                              f"{free / 2**20:.0f} MB free: {fix}")
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, nbytes)
        else:
            os.ftruncate(fd, nbytes)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT):
            raise
        raise BoxTooLarge(f"the asynchronous producer's weight box needs {mb:.0f} MB and {where} could not hold "
                          f"it ({e.strerror}): {fix}") from None


def _size(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = 1
    for s in shape:
        n *= s
    return n * torch.empty((), dtype=dtype).element_size()
