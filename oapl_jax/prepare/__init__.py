"""Getting a real model and real data onto this host (the `oapl-prepare` command's library).

    path = model.fetch("Qwen/Qwen3-0.6B", "~/models/Qwen3-0.6B")   # hub id or local directory
    summary = model.verify(path)                                    # loads it through models/factory.py
    written = data.prepare("gsm8k", "~/data/gsm8k")                 # the JSONL files configs/gsm8k.py reads
"""
