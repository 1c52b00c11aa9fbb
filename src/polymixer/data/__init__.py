"""Loaders for real formats and the offline defaults."""

from .lm import GPT2BPE, ByteTokenizer, Corpus, TokenWindows, load_tokenizer, prepare_corpus

__all__ = ["ByteTokenizer", "GPT2BPE", "Corpus", "TokenWindows", "load_tokenizer", "prepare_corpus"]
