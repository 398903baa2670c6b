"""Sampling from an energy-based model: SGLD, the replay buffer, JEM++'s proximal SGLD, refinement.

Public names (import them from here; jemeval's own modules import the defining submodule)::

    from jemeval.sampling import SGLD, ReplayBuffer, frozen, input_grad, recorded_sgld
"""
from jemeval.sampling.buffer import ReplayBuffer, uniform_like_shape
from jemeval.sampling.recorded import recorded_sgld
from jemeval.sampling.sgld import SGLD, frozen, input_grad, model_log_p

__all__ = ["SGLD", "ReplayBuffer", "frozen", "input_grad", "model_log_p", "recorded_sgld", "uniform_like_shape"]
