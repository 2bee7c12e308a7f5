"""Consistency LLMs (Kou et al., ICML 2024): fine-tune a model on its own Jacobi trajectories so that
Jacobi decoding reaches the fixed point in fewer iterations.

trajectories.py  collect Jacobi trajectories of the model over prompts (resumable JSONL)
losses.py        global / local consistency loss and the AR loss
train.py         the training loop (HF accelerate), checkpoints, resume, loss log
"""
