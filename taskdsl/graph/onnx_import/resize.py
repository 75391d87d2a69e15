"""Converters of Resize / Upsample and ConvTranspose."""
