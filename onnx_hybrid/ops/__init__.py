"""The operator contract, the float64 reference, replay, and the native custom-op library."""

from .contract import DOMAIN, GATED_DELTA_NET, MS_DOMAIN, VARLEN_CAUSAL_CONV, ContractError
from .library import library_path, register

__all__ = ["DOMAIN", "GATED_DELTA_NET", "MS_DOMAIN", "VARLEN_CAUSAL_CONV", "ContractError", "library_path", "register"]
