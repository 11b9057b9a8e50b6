"""Graph building, one module per layer kind."""
