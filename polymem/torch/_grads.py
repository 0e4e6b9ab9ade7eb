"""Who may train a model's parameters while memory sites are attached: the model's own ``requires_grad`` flags,
saved by the first attach, and the live handles that freeze it (:mod:`polymem.torch.attach`)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn


@dataclass
class _GradState:
    """The model's own requires_grad flags, saved by the first attach, and which live handles freeze it."""

    original: dict[str, bool]
    freezers: dict[int, bool] = field(default_factory=dict)  # id(handle) -> does it freeze the model


# One entry per model with live handles; weak, so a model dropped without detach is not kept alive.
_GRAD_STATES: "weakref.WeakKeyDictionary[nn.Module, _GradState]" = weakref.WeakKeyDictionary()


def hold_grads(model: nn.Module, handle: Any, freeze: bool) -> None:
    state = _GRAD_STATES.get(model)
    if state is None:
        state = _GRAD_STATES[model] = _GradState({n: p.requires_grad for n, p in model.named_parameters()})
    state.freezers[id(handle)] = freeze
    _apply_grads(model, state)


def release_grads(model: nn.Module, handle: Any) -> None:
    """Drop ``handle``'s hold: a parameter trains again iff it did before the first attach and no live handle
    freezes the model, whatever order the handles are detached in."""
    state = _GRAD_STATES.get(model)
    if state is None or state.freezers.pop(id(handle), None) is None:
        return
    _apply_grads(model, state)
    if not state.freezers:
        del _GRAD_STATES[model]


def _apply_grads(model: nn.Module, state: _GradState) -> None:
    frozen = any(state.freezers.values())
    for name, p in model.named_parameters():
        if name in state.original:
            p.requires_grad_(state.original[name] and not frozen)
