"""Any logits network read as a joint energy-based model: EnergyModel and log p~."""
from jemeval.energy.model import EnergyModel, log_p

__all__ = ["EnergyModel", "log_p"]
