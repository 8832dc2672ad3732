"""A Hugging Face causal LM as the trainer's policy: loading checks, tokenizer, sampler,
prompt sharing, and ``make-tiny`` (a tiny random model made locally)."""
