"""The seed's error contract, at the seed's paths: ``errors`` (the seven classes) and
``error_classification`` (``classify_provider_error()``, ``parse_retry_after()``)."""
