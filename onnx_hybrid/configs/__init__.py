"""genai_config.json for hybrid decoders: the `state_groups` writer (released and bindings forms), the
validator and the converter between the forms."""

from .convert import ConversionError, convert_config
from .findings import Finding, Report
from .validator import validate, validate_config

__all__ = ["ConversionError", "Finding", "Report", "convert_config", "validate", "validate_config"]
