"""Llama-family models on any anychip device: checkpoints (GGUF, Hugging Face), tokenizer,
the model, generation and their commands."""
