"""weightswarm node agent: fetches model weights into a Hugging Face hub cache."""
