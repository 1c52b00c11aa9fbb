"""Loaders for real formats and the offline defaults."""

from .text import ByteTokenizer, Corpus, GPT2BPE, TokenWindows, load_tokenizer, prepare_corpus

__all__ = ["ByteTokenizer", "GPT2BPE", "Corpus", "TokenWindows", "load_tokenizer", "prepare_corpus"]
