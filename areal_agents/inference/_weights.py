"""New weights for a running embedded server: read from disk, or received from a trainer's
broadcast over a gloo process group (SGLang's ``/init_weights_update_group`` and
``/update_weights_from_distributed``, on CPU)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal_agents.config import DTYPES
from areal_agents.inference.protocol import BadRequest, is_int, require
from areal_agents.inference.weight_group import drop_weight_group, new_weight_group

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup
    from transformers import PreTrainedModel

__all__ = ["WeightGroups", "check_fit", "load_state_dict"]


def check_fit(shapes: Mapping[str, Sequence[int]], model: PreTrainedModel, where: str, *, complete: bool) -> None:
    """Raise ``ValueError`` unless every tensor of ``shapes`` is a parameter of ``model`` with
    that shape (and, when ``complete``, every parameter is there; tied output embeddings may be absent)."""
    expected = model.state_dict()
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - set(shapes) - tied) if complete else []
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise ValueError(f"weights in {where} do not fit the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
    bad = [k for k, v in shapes.items() if tuple(v) != tuple(expected[k].shape)]
    if bad:
        raise ValueError(f"weights in {where} have wrong shapes for {bad[:4]}")


def load_state_dict(path: str | Path, model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """Read the safetensors weights in ``path`` and check them against ``model``.

    Raises ``ValueError`` naming the problem (no weights, missing/unexpected tensors,
    shape mismatches); tied output embeddings may be absent.
    """
    from safetensors.torch import load_file

    root = Path(path)
    files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
    if not files:
        raise ValueError(f"no *.safetensors weights in {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    check_fit({k: v.shape for k, v in state.items()}, model, str(path), complete=True)
    return state


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    v: Any = body.get(key)
    require(is_int(v) and lo <= v <= hi, f"'{key}' must be an integer in [{lo}, {hi}]")
    return int(v)


class WeightGroups:
    """The weight-update process group this server is in (the newest one it joined); its
    collectives wait ``timeout_s`` at most, or what the join's ``timeout_s`` says.

    Both methods block (run them off the event loop): :meth:`join` until every member of the
    group has joined, :meth:`receive` until the trainer has broadcast every announced tensor.
    A broadcast that fails (the trainer tore the group down because another member died)
    leaves the group: the trainer forms a new one for its next update.
    """

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s
        self.name: str | None = None
        self.group: ProcessGroup | None = None

    def join(self, body: Mapping[str, Any]) -> None:
        """Join the group of an ``/init_weights_update_group`` body as ranks ``rank_offset``."""
        addr: Any = body.get("master_address")
        name: Any = body.get("group_name", "weight_update_group")
        require(isinstance(addr, str) and bool(addr), "'master_address' (a string) is required")
        require(isinstance(name, str) and bool(name), "'group_name' must be a non-empty string")
        port = _int(body, "master_port", 1, 65535)
        world = _int(body, "world_size", 2, 1 << 16)
        rank = _int(body, "rank_offset", 1, world - 1)
        backend = body.get("backend", "nccl")
        require(backend == "gloo", f"the embedded server runs on CPU: 'backend' must be gloo (got {backend!r})")
        timeout: Any = body.get("timeout_s", self.timeout_s)
        require(isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout <= 86400,
                "'timeout_s' must be a number of seconds in (0, 86400]")
        require(name != self.name, f"weight update group {name!r} exists already: a new group takes a new name")
        self.leave()  # a trainer that re-forms its group leaves the old one
        self.group = new_weight_group("gloo", addr, port, world, rank, name, float(timeout))
        self.name = name

    def leave(self) -> None:
        """Leave the current group, if any (its name stays taken)."""
        group, self.group = self.group, None
        if group is not None:
            drop_weight_group(group)

    def _group(self) -> ProcessGroup:
        if self.group is None:
            raise RuntimeError("the weight update group was left")
        return self.group

    def receive(self, body: Mapping[str, Any], model: PreTrainedModel, check: bool = True) -> dict[str, torch.Tensor]:
        """The tensors an ``/update_weights_from_distributed`` body announces, received from rank 0.

        Tensors that do not fit ``model`` are still received (so the trainer's broadcast
        completes and the group stays usable), then refused with :class:`BadRequest`
        (``check=False``: the caller checks them, e.g. LoRA adapter tensors).
        """
        import torch

        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        name = body.get("group_name", "weight_update_group")
        require(isinstance(names, list) and all(isinstance(n, str) for n in names), "'names' must be a list of strings")
        require(isinstance(dtypes, list) and all(d in DTYPES for d in dtypes),
                f"'dtypes' must be a list of {', '.join(DTYPES)}")  # fmt: skip
        require(isinstance(shapes, list) and all(isinstance(s, list) and all(is_int(x) and x >= 0 for x in s)
                                                 for s in shapes), "'shapes' must be a list of lists of sizes")
        assert isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
        require(len(names) == len(dtypes) == len(shapes), "'names', 'dtypes' and 'shapes' differ in length")
        require(name == self.name and self.group is not None,
                f"no weight update group {name!r}: call /init_weights_update_group first")
        state = {n: torch.empty(s, dtype=getattr(torch, d)) for n, d, s in zip(names, dtypes, shapes, strict=True)}
        try:
            for tensor in state.values():
                self._group().broadcast(tensor, 0).wait()
        except Exception:
            self.leave()  # broken for good: another member died, or the trainer tore it down
            raise
        try:
            if check:
                check_fit({n: t.shape for n, t in state.items()}, model, "the broadcast", complete=False)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return state
