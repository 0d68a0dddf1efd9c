"""The Llama family (Llama 3, 3.1, 3.2): its config, presets and llama3 rotary scaling (config.py) and its
Hugging Face config mapping (hf.py). The network is the shared models/decoder.py; models/families.py registers it."""
