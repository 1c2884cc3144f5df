"""Sampling behind one ``Generator`` protocol: transformers on CPU/GPU (``generation``), vLLM
(``vllm_generation``), the HF generator's prefix cache and compact decoding (``prefix_cache``),
and OpenAI-compatible endpoints for the USER simulator and judges
(``endpoints``)."""
