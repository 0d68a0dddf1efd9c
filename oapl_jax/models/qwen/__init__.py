"""The Qwen family (Qwen2, Qwen2.5, Qwen3, R1-Distill-Qwen): its config and presets (config.py) and its Hugging
Face config mapping (hf.py). The network is the shared models/decoder.py; models/families.py registers it."""
