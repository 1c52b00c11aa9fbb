"""The distill family's experiment: attention → PoM distillation of a trained language model (pomify + fine-tuning),
its command and bench."""
