"""per_role's second policy inside the trainer: its optimizer group, its clipping, its checkpoint.

In ``grpo.mode="per_role"`` (paper Fig. 3) a copy of the policy, ``rehearse_model``, trains on the
REHEARSE rows only (``grpo.RoleWiseGRPOTrainer._compute_loss`` routes each role's rows). This is
the bookkeeping that makes it a policy of its own under TRL's loop: ``PerRolePolicyMixin`` adds its
trainable parameters to the optimizer as a separate Adam group, clips each role's gradients on its
own (``role_grad_norms``), and saves and restores its trainable tensors in every checkpoint folder
(``REHEARSE_WEIGHTS``). With no ``rehearse_model`` every override is TRL's behaviour.

Usage::

    from envace_lite.core.per_role_policy import REHEARSE_WEIGHTS

    trainer.train()                          # a RoleWiseGRPOTrainer with grpo.mode="per_role"
    trainer.role_grad_norms                  # {"act": 0.8, "rehearse": 1.3}, before clipping
    (run_dir / "checkpoint-3" / REHEARSE_WEIGHTS).exists()   # True
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file


class PerRolePolicyMixin:
    """The second policy's optimizer, clipping and checkpoint overrides for a TRL trainer.

    Put it before ``GRPOTrainer`` in the bases: each override calls TRL's through ``super()``.
    It reads the trainer's ``rehearse_model`` (None unless per_role: then every override is
    TRL's), ``model``, ``args``, ``state`` and ``accelerator``, and sets ``role_grad_norms``
    (``{role: norm}``, each role's gradient norm before clipping at the last optimizer step).
    """

    # ---- per_role: a second set of parameters in the optimizer, clipped on its own -----------
    def _role_params(self) -> dict[str, list[torch.nn.Parameter]]:
        return {"act": [p for p in self.model.parameters() if p.requires_grad],
                "rehearse": [p for p in self.rehearse_model.parameters() if p.requires_grad]}

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        optimizer = super().create_optimizer(model)
        if self.rehearse_model is not None and not any(
                getattr(gr, "role", "") == "rehearse" for gr in optimizer.param_groups):
            # Adam keeps state per parameter, so a separate group is a separate optimizer; only
            # the clipping couples parameters, and _clip_grad_norm clips each role on its own.
            optimizer.add_param_group({"params": self._role_params()["rehearse"],
                                       "weight_decay": self.args.weight_decay, "role": "rehearse"})
        return optimizer

    def _role_norms(self, max_norm: float) -> float:
        norms = {r: float(torch.nn.utils.clip_grad_norm_(ps, max_norm))
                 for r, ps in self._role_params().items()}
        self.role_grad_norms = norms
        return math.sqrt(sum(n * n for n in norms.values()))

    def _clip_grad_norm(self, model: Any) -> Any:
        if self.rehearse_model is None:
            return super()._clip_grad_norm(model)
        return self._role_norms(self.args.max_grad_norm)

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        if self.rehearse_model is None or grad_norm is not None:
            return super()._get_grad_norm(model, grad_norm)
        return self._role_norms(float("inf"))

    # ---- per_role checkpoints: the REHEARSE policy's trainable tensors ----------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        if self.rehearse_model is not None and self.args.should_save:
            folder = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            # written before TRL's files: trainer_state.json, written last, marks a complete one
            save_file(_trainable_state(self.accelerator.unwrap_model(self.rehearse_model)),
                      folder / REHEARSE_WEIGHTS)
        super()._save_checkpoint(model, trial)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self.rehearse_model is not None:
            state = load_file(Path(resume_from_checkpoint) / REHEARSE_WEIGHTS)
            params = dict(self.accelerator.unwrap_model(self.rehearse_model).named_parameters())
            with torch.no_grad():
                for name, tensor in state.items():
                    params[name].copy_(tensor)


REHEARSE_WEIGHTS = "rehearse_policy.safetensors"
"""per_role: the REHEARSE policy's trainable tensors inside each checkpoint folder."""


def _trainable_state(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().cpu() for n, p in model.named_parameters() if p.requires_grad}

