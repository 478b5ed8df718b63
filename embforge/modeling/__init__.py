"""How a backbone turns token ids into vectors: tokenising with prompts, padding, the padding-free (packed)
forward, pooling, mixed precision, finding model folders, and the ONNX runtime twin of the encoders."""
