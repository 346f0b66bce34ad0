"""Qwen3-Omni (thinker, audio and vision encoders, talker, code2wav): the real model's classes from
transformers and vLLM, served as omniray stages."""
