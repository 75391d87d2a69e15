"""Converters of attention blocks: Attention and RotaryEmbedding (opset 23)."""
