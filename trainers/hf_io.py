"""Model files on disk: dtype names to torch dtypes, HF model dirs, and directories published atomically."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from areal_agents.config import DTYPES

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["TORCH_DTYPES", "fsync_dir", "publish_dir", "write_hf_dir", "write_model_dir"]

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
"""The torch dtype of each dtype name a config accepts (``actor.dtype``, ``sglang.dtype``, ...)."""

_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth")
_SKIP = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json",
         "sft_report.json", "rm_report.json"}  # a report tells of the model it sits beside, not of one trained from it


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of directory ``path`` (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(tmp: Path, out: Path, *, durable: bool = True) -> Path:
    """Replace ``out`` by the finished directory ``tmp`` (a sibling) so a reader sees the old or
    the new one whole: every file under ``tmp`` is fsynced (unless not ``durable``: a hand-off
    to another process on this machine, which the page cache already serves whole), then
    renamed into place."""
    for dirpath, _, files in os.walk(tmp) if durable else ():
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(dirpath)
    trash = None
    if out.exists():
        trash = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, trash)
    os.rename(tmp, out)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    if durable:
        fsync_dir(out.parent)
    return out


def _copy_side_files(src_dir: str | os.PathLike[str], dst: Path) -> None:
    """Copy the tokenizer/generation files of model dir ``src_dir`` (not its weights or config) into ``dst``."""
    src = Path(src_dir)
    for f in src.iterdir() if src.is_dir() else []:
        if f.is_file() and f.name not in _SKIP and not f.name.endswith(_WEIGHT_FILES) and not f.name.startswith("adapter_"):
            shutil.copy2(f, dst / f.name)


def write_model_dir(out_dir: str | os.PathLike[str], src_dir: str | os.PathLike[str],
                    write: Callable[[Path], None], *, durable: bool = True) -> Path:
    """Fill a temporary sibling of ``out_dir`` with ``write(tmp)`` and the tokenizer/generation
    files of ``src_dir``, then publish it as ``out_dir`` (:func:`publish_dir`, ``durable`` as there)."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write(tmp)
        _copy_side_files(src_dir, tmp)
        return publish_dir(tmp, out, durable=durable)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once published


def write_hf_dir(state: dict[str, torch.Tensor], hf_config: PretrainedConfig, src_dir: str | os.PathLike[str],
                 out_dir: str | os.PathLike[str], dtype: torch.dtype, *, durable: bool = True) -> Path:
    """Write ``state`` as ``model.safetensors`` + ``config.json`` + the tokenizer/generation
    files of ``src_dir`` into ``out_dir``, atomically (:func:`publish_dir`, ``durable`` as there).

    Tied output embeddings are stored once, as HF does. An existing ``out_dir`` is replaced.
    """
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in state.items()}
        if getattr(hf_config, "tie_word_embeddings", False):
            tensors.pop("lm_head.weight", None)
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        out_cfg = copy.deepcopy(hf_config)
        out_cfg.dtype = dtype
        out_cfg.save_pretrained(tmp)

    return write_model_dir(out_dir, src_dir, write, durable=durable)
