"""Sampling behind one ``Generator`` protocol: transformers on CPU/GPU (``generation``), vLLM
(``vllm_generation``), and OpenAI-compatible endpoints for the USER simulator and judges
(``endpoints``)."""
