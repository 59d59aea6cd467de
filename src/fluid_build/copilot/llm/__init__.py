"""Provider adapters: one module per provider's wire format."""
