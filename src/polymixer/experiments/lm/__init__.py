"""The lm family's experiment: language models (GPT-2 / GPPoM2 / hybrids / value PoM): text corpora and tokenised
windows, train / eval / generate, the LM bench."""
