"""The forge application: an intent file in, a validated data-product contract out."""
